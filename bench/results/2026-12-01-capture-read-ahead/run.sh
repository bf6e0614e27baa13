#!/bin/bash
# A follower restarted under PostgreSQL's load, its chunks captured for it with their images
# read ahead while the applies go on (snapshot.rs Precopy, the default) and without
# (TUNDRA_TEST_CAPTURE_NO_READ_AHEAD=1: the whole capture holds the applies): the runs and
# summary of ../2026-12-01-pre-vote/run.sh, alternating these two modes. Usage: bash run.sh
# [TUNDRA_BIN] [ROUNDS] (root; about a minute a run).
here=$(cd "$(dirname "$0")" && pwd)
AB_DIR=$here AB_MODES="read-ahead no-read-ahead" AB_OFF=TUNDRA_TEST_CAPTURE_NO_READ_AHEAD \
  exec bash "$here/../2026-12-01-pre-vote/run.sh" "$@"
