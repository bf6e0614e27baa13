"""Tests of the report's arithmetic on hand-made results (run: python -m unittest bench.eval.test_report)."""
from __future__ import annotations

import pathlib
import tempfile
import unittest

from bench.eval.report import write_report
from bench.eval.run import ABLATION, QUICK, SYSTEMS

MIB = 1 << 20


def sizes(logical_mib: float, physical_mib: float) -> dict:
    return {"logical_bytes": logical_mib * MIB, "physical_bytes": physical_mib * MIB,
            "ratio": logical_mib / physical_mib, "details": {"mix": {"raw": 0.1, "lz4": 0.3, "zstd": 0.6}}}


def results() -> dict:
    systems = {s.name: {"stack": s.stack, "baseline": s.baseline, "table_options": s.table_options,
                        "settings": s.settings, "description": s.description} for s in SYSTEMS}
    space = [
        {"database": "postgresql", "system": "ext4", "dataset": "tpch", "after_load": sizes(100, 100),
         "after_updates": sizes(110, 110), "samples": [{"t": 3.0, "ratio": 1.0}]},
        {"database": "postgresql", "system": "btrfs-force", "dataset": "tpch", "after_load": sizes(100, 25),
         "after_updates": sizes(110, 80), "samples": [{"t": 3.0, "ratio": 2.0}]},
        {"database": "postgresql", "system": "tundra", "dataset": "tpch", "after_load": sizes(100, 40),
         "after_updates": sizes(110, 44), "samples": [{"t": 3.0, "ratio": 2.5}]},
        {"database": "postgresql", "system": "xfs", "dataset": "tpch", "error": "mkfs.xfs failed: test"},
    ]

    def run(tps):
        return {"tps": tps, "p95_ms": 5.0}
    throughput = [
        {"database": "postgresql", "system": "ext4", "dataset": "sysbench", "after_load": sizes(50, 50),
         "after_updates": sizes(60, 60), "workloads": {"oltp_point_select": run(1000), "oltp_insert": run(200)}},
        {"database": "postgresql", "system": "tundra-off", "dataset": "sysbench", "after_load": sizes(50, 50),
         "after_updates": sizes(60, 60), "workloads": {"oltp_point_select": run(500), "oltp_insert": run(100)}},
        {"database": "postgresql", "system": "tundra", "dataset": "sysbench", "after_load": sizes(50, 20),
         "after_updates": sizes(60, 24), "workloads": {"oltp_point_select": run(490), "oltp_insert": run(110)}},
    ]
    def layout(name, physical, lz4=0, zstd=0, raw=0):
        return {"name": name, "pages": 100, "software_4k_bytes": 400 * 1024, "physical_bytes": physical,
                "software_4k_ratio": 2.0, "ratio": 819200 / physical, "lz4_pages": lz4, "zstd_pages": zstd,
                "raw_pages": raw, "write_us_mean": 300.0, "read_us_mean": 90.0, "decompress_us_mean": 5.0,
                "read_overhead_us": 1.5}
    measure = {"logical_bytes": 819200, "drive_only_physical_bytes": 409600, "drive_only_ratio": 2.0,
               "plain_write_us_mean": 150.0, "plain_read_us_mean": 60.0,
               "layouts": [layout("none", 409600, raw=100), layout("lz4", 409600, lz4=100),
                           layout("zstd", 320000, zstd=100), layout("adaptive", 327680, lz4=20, zstd=80)]}
    analyze = {"algorithms": {"adaptive": {"dual_layer_bytes": 331000}},
               "figure5c": {"software_percent": 40.0, "software_4k_percent": 5.0, "dual_layer_percent": 2.0},
               "figure2": {"granularity": {"block_4k_extra_percent": 60.0},
                           "input_sizes": [{"input_bytes": 4096, "ratio": 2.0}, {"input_bytes": 16384, "ratio": 2.5},
                                           {"input_bytes": 65536, "ratio": 3.0}, {"input_bytes": 1 << 20, "ratio": 3.5}]}}
    store = [{"dataset": "tpch", "scale": "quick", "measure": measure, "analyze": analyze, "seconds": 1.0,
              "commands": ["scripts/datasets --scale quick tpch"]},
             {"dataset": "tpcds", "scale": "quick", "error": "tundra-bench store failed: test"}]
    return {"meta": {"command": "bench/run --quick", "date": "2026-11-23T00:00:00+00:00", "finished": "x",
                     "wall_seconds": 1, "size": QUICK.__dict__ | {"name": "quick"}, "databases": ["postgresql"],
                     "datasets": ["tpch"], "workloads": ["oltp_point_select", "oltp_insert"],
                     "systems": systems, "ablation": ABLATION, "machine": {}, "tundra": {"git": "abc"}},
            "space": space, "throughput": throughput, "store": store, "drive": None,
            "problems": ["postgresql / xfs / tpch: mkfs.xfs failed: test"]}


class ReportTest(unittest.TestCase):
    def test_tables_plots_and_losses(self):
        with tempfile.TemporaryDirectory() as d:
            out = pathlib.Path(d)
            text = write_report(results(), out).read_text()
            # Space: tundra 2.50 -> 2.50 and 100/40 = 2.50x smaller than ext4; btrfs 4.00 -> 1.38.
            self.assertIn("| `tundra` | 2.50 → 2.50<br>2.50x vs ext4 |", text)
            self.assertIn("| `btrfs-force` | 4.00 → 1.38<br>1.38x vs ext4 |", text)
            self.assertIn("| `xfs` | failed |", text)
            # Throughput: normalised to the baseline, and to ext4 in brackets.
            self.assertIn("0.98x (0.49x)", text)
            self.assertIn("1.10x (0.55x)", text)
            # The peer that beats Tundra is named, in space after load and in throughput.
            self.assertIn("`btrfs-force` holds 25.0 MiB against Tundra's 40.0 MiB", text)
            self.assertIn("`ext4` 1,000 tps against Tundra's 490", text)
            self.assertIn("mkfs.xfs failed: test", text)
            self.assertIn("| tpch | 10.0% | 30.0% | 60.0% |", text)
            # The store alone: 819200 / 327680 = 2.50, 25.0% over the drive alone (2.00); Algorithm 1
            # stores 327680 / 320000 - 1 = 2.4% more than zstd; analyze 331000 / 327680 - 1 = +1.01%.
            self.assertIn("| tpch | 0.8 | 2.00 | 2.00 | 2.00 | 2.56 | 2.50 (+25.0%) | +2.4% | 20 / 80 / 0 | +1.01% |", text)
            self.assertIn("| tpcds | failed |", text)
            self.assertIn("| tpch | 150 | 300 (2.00x) | 60 | 90 (1.50x) | 5.0 / 5.0 / 5.0 | +1.5 |", text)
            self.assertIn("| tpch | +40.0% | +5.0% | +2.0% | +60.0% | 2.00 / 2.50 / 3.00 / 3.50 |", text)
            for png in ("space-postgresql.png", "store-ratios.png", "decay-postgresql.png", "throughput-postgresql.png"):
                self.assertGreater((out / png).stat().st_size, 1000, png)


if __name__ == "__main__":
    unittest.main()


class MediaBytesTest(unittest.TestCase):
    def test_live_and_allocated_for_a_filesystem_and_for_tundra(self):
        from bench.eval.report import media_bytes
        ext4 = {"physical_bytes": 70 * MIB, "fs_used_bytes": 66 * MIB, "details": {"image_allocated_bytes": 70 * MIB}}
        self.assertEqual(media_bytes(ext4), (66 * MIB, 70 * MIB))
        tundra = {"physical_bytes": 30 * MIB, "fs_used_bytes": 90 * MIB,
                  "details": {"host_files_allocated_bytes": {"drive.img": 50 * MIB, "fast.img": 12 * MIB}}}
        self.assertEqual(media_bytes(tundra), (30 * MIB, 62 * MIB))
        self.assertEqual(media_bytes({}), (None, None))
        counted = dict(tundra, live_bytes=33 * MIB, allocated_bytes=40 * MIB)
        self.assertEqual(media_bytes(counted), (33 * MIB, 40 * MIB))

    def test_after_gc_takes_the_collected_drive_or_the_trimmed_image(self):
        from bench.eval.report import after_gc_bytes
        ext4 = {"after_updates": {"live_bytes": 66 * MIB, "allocated_bytes": 70 * MIB}}
        self.assertEqual(after_gc_bytes(ext4), 70 * MIB)
        tundra = {"after_updates": {"live_bytes": 30 * MIB, "allocated_bytes": 90 * MIB},
                  "post_check": {"fsck": "clean", "after_gc": {"allocated_bytes": 41 * MIB}}}
        self.assertEqual(after_gc_bytes(tundra), 41 * MIB)


class MedianRunTest(unittest.TestCase):
    def test_median_of_three_keeps_every_run(self):
        from bench.eval.run import median_run
        runs = [{"tps": 90.0, "p95_ms": 9}, {"tps": 110.0, "p95_ms": 7}, {"tps": 100.0, "p95_ms": 8}]
        m = median_run(runs)
        self.assertEqual((m["tps"], m["p95_ms"]), (100.0, 8))
        self.assertEqual(sorted(r["tps"] for r in m["runs"]), [90.0, 100.0, 110.0])
        self.assertEqual(median_run([{"tps": 10.0}, {"tps": 20.0}])["tps"], 15.0)


class ExtrasTest(unittest.TestCase):
    def test_each_benchmark_links_its_summary_or_names_its_failure(self):
        import pathlib
        from bench.eval.report import Report
        results = {"extras": [
            {"name": "real-table", "command": "scripts/bench-real-table OUT/real-table 3", "env": {}, "dir": "real-table",
             "seconds": 700.0},
            {"name": "drive", "command": "scripts/bench-drive OUT/drive -- --suite latency", "env": {"RUNS": "3"},
             "dir": "drive", "seconds": 90.0, "error": "tundra-bench drive exited 1"}]}
        r = Report(results, pathlib.Path("/nonexistent"))
        r.extras()
        text = "\n".join(r.lines)
        self.assertIn("[summary.md](real-table/summary.md)", text)
        self.assertIn("`RUNS=3 scripts/bench-drive OUT/drive -- --suite latency`", text)
        self.assertIn("failed: tundra-bench drive exited 1", text)
