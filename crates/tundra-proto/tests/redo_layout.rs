//! Version 2's bodies pinned byte by byte against docs/protocol.md from outside the crate: every
//! redo request and reply layout, refusal bodies with their LSN first, the argument rules every
//! server applies, the vectored read's bound checked before anything is allocated, and the
//! append's length-checked records.

use tundra_proto::message::{decode_refusal, put_refusal_head};
use tundra_proto::{
    AppendOutcome, LATEST_LSN, LeaseRenewal, MAX_PAGES_PER_READ, Opcode, PageList, PageRead, PagesRead, ReadAt,
    ReaderLease, RedoAppend, RedoStatus, Reply, Request, ServedPage, ServedPages, Status,
};

const AT: ReadAt = ReadAt { request_lsn: 90, not_modified_since: 80, lease: Some(3) };

/// The little-endian bytes of `values`, each `width` bytes wide, as docs/protocol.md lays
/// the fields out.
fn fields(values: &[(u64, usize)]) -> Vec<u8> {
    values.iter().flat_map(|&(value, width)| value.to_le_bytes()[..width].to_vec()).collect()
}

#[test]
fn redo_request_layouts_are_the_documented_ones() {
    let append = RedoAppend { volume: 2, writer_epoch: 3, prev_lsn: 4, end_lsn: 6, record_count: 2, records: b"ab" };
    let mut expected = fields(&[(2, 4), (3, 8), (4, 8), (6, 8), (2, 4), (2, 4)]);
    expected.extend_from_slice(b"ab");
    assert_eq!(Request::AppendRedo(append).encode_body(), expected);
    assert_eq!(Request::AppendRedo(append).trailing_data(), b"ab");
    assert_eq!(Request::RedoStatus { volume: 9 }.encode_body(), fields(&[(9, 4)]));
    let read = PageRead { volume: 2, page: 5, at: AT };
    let expected = fields(&[(2, 4), (5, 8), (90, 8), (80, 8), (1, 1), (3, 8)]);
    assert_eq!(Request::GetPageAtLsn(read).encode_body(), expected);
    let unleased = PageRead { at: ReadAt { lease: None, ..AT }, ..read };
    let expected = fields(&[(2, 4), (5, 8), (90, 8), (80, 8), (0, 1), (0, 8)]);
    assert_eq!(Request::GetPageAtLsn(unleased).encode_body(), expected);
    let read = PagesRead { volume: 2, pages: PageList::Numbers(&[7, 8]), at: AT };
    let expected = fields(&[(2, 4), (90, 8), (80, 8), (1, 1), (3, 8), (2, 4), (7, 8), (8, 8)]);
    assert_eq!(Request::GetPagesAtLsn(read).encode_body(), expected);
    let register = Request::RegisterReader { volume: 2, reader_id: 5, start_lsn: 6 };
    assert_eq!(register.encode_body(), fields(&[(2, 4), (5, 8), (6, 8)]));
    let renew = Request::RenewReader { volume: 2, lease_id: 5, apply_lsn: 6 };
    assert_eq!(renew.encode_body(), fields(&[(2, 4), (5, 8), (6, 8)]));
    assert_eq!(Request::ReleaseReader { volume: 2, lease_id: 5 }.encode_body(), fields(&[(2, 4), (5, 8)]));
}

#[test]
fn redo_reply_layouts_are_the_documented_ones() {
    let body = |reply: Reply| {
        let mut out = Vec::new();
        reply.encode_body(&mut out);
        out
    };
    assert_eq!(body(Reply::Appended(AppendOutcome::Ok { durable_lsn: 7 })), fields(&[(0, 1), (7, 8)]));
    assert_eq!(body(Reply::Appended(AppendOutcome::Gap { expected_prev_lsn: 7 })), fields(&[(1, 1), (7, 8)]));
    assert_eq!(body(Reply::Appended(AppendOutcome::Fenced { epoch: 7 })), fields(&[(2, 1), (7, 8)]));
    let status = RedoStatus { writer_epoch: 1, durable_lsn: 2, complete_lsn: 3, lsn_min: 4 };
    assert_eq!(body(Reply::RedoStatus(status)), fields(&[(1, 8), (2, 8), (3, 8), (4, 8)]));
    let mut expected = fields(&[(9, 8), (8, 8)]);
    expected.extend_from_slice(b"page");
    let page = ServedPage { served_lsn: 9, page_lsn: 8, data: b"page".to_vec() };
    assert_eq!(body(Reply::PageAtLsn(page)), expected);
    let pages = ServedPages { served_lsn: 9, page_size: 2, page_lsns: vec![5, 6], data: b"abcd".to_vec() };
    let mut expected = fields(&[(9, 8), (2, 4), (2, 4), (5, 8), (6, 8)]);
    expected.extend_from_slice(b"abcd");
    assert_eq!(body(Reply::PagesAtLsn(pages.clone())), expected);
    assert_eq!(pages.page(1), Some((6, &b"cd"[..])));
    assert_eq!(pages.page(2), None);
    let lease = ReaderLease { lease_id: 1, granted_lsn: 2, valid_for_ms: 3 };
    assert_eq!(body(Reply::Lease(lease)), fields(&[(1, 8), (2, 8), (3, 8)]));
    assert_eq!(body(Reply::Renewed(LeaseRenewal { valid_for_ms: 1, lsn_min: 2 })), fields(&[(1, 8), (2, 8)]));
}

#[test]
fn refusals_carry_their_lsn_first() {
    let mut body = Vec::new();
    put_refusal_head(&mut body, Status::TooOld, Some(42));
    body.extend_from_slice(b"gone");
    assert_eq!(decode_refusal(Opcode::GetPageAtLsn, Status::TooOld, &body), Ok((Some(42), "gone".into())));
    assert!(decode_refusal(Opcode::GetPageAtLsn, Status::NotYet, &[1, 2, 3]).is_err());
    assert_eq!(decode_refusal(Opcode::ReadPage, Status::Invalid, b"bad"), Ok((None, "bad".into())));
    let mut plain = Vec::new();
    put_refusal_head(&mut plain, Status::Invalid, Some(42));
    assert!(plain.is_empty(), "only the statuses that carry an LSN have one");
}

#[test]
fn protocol_rules_for_redo_arguments() {
    let append = RedoAppend { volume: 1, writer_epoch: 1, prev_lsn: 10, end_lsn: 12, record_count: 2, records: b"xy" };
    assert_eq!(Request::AppendRedo(append).problem(), None);
    let heartbeat = RedoAppend { record_count: 0, records: b"", ..append };
    assert_eq!(Request::AppendRedo(heartbeat).problem(), None);
    let broken = [
        RedoAppend { end_lsn: 9, record_count: 0, records: b"", ..append },
        RedoAppend { record_count: 3, records: b"xyz", ..append },
        RedoAppend { record_count: 0, ..append },
        RedoAppend { records: b"", ..append },
        RedoAppend { records: b"x", ..append },
    ];
    for append in broken {
        assert!(Request::AppendRedo(append).problem().is_some(), "{append:?}");
    }
    let read = |request_lsn, not_modified_since| {
        Request::GetPageAtLsn(PageRead {
            volume: 1,
            page: 0,
            at: ReadAt { request_lsn, not_modified_since, lease: None },
        })
    };
    assert_eq!(read(5, 5).problem(), None);
    assert_eq!(read(LATEST_LSN, 0).problem(), None);
    assert!(read(0, 0).problem().is_some(), "LSN 0 is before every record");
    assert!(read(5, 6).problem().is_some());
    let none = Request::GetPagesAtLsn(PagesRead { volume: 1, pages: PageList::Numbers(&[]), at: AT });
    assert!(none.problem().is_some());
    let too_many = vec![0; MAX_PAGES_PER_READ + 1];
    let many = Request::GetPagesAtLsn(PagesRead { volume: 1, pages: PageList::Numbers(&too_many), at: AT });
    assert!(many.problem().is_some());
}

#[test]
fn a_vectored_read_is_bounded_before_anything_is_allocated() {
    let mut body = fields(&[(1, 4), (9, 8), (0, 8), (0, 1), (0, 8)]);
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    let error = Request::decode(Opcode::GetPagesAtLsn, &body).unwrap_err();
    assert!(error.message.contains("at most"), "{error}");
    let mut reply = fields(&[(9, 8), (16, 4)]);
    reply.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Reply::decode(Opcode::GetPagesAtLsn, reply).is_err());
    // Counts that fit the bound still need their bytes.
    let mut short = fields(&[(1, 4), (9, 8), (0, 8), (0, 1), (0, 8), (2, 4)]);
    short.extend_from_slice(&[0; 15]);
    assert!(Request::decode(Opcode::GetPagesAtLsn, &short).is_err());
}

#[test]
fn append_records_are_length_checked() {
    let append = RedoAppend { volume: 1, writer_epoch: 1, prev_lsn: 0, end_lsn: 9, record_count: 1, records: b"abc" };
    let body = Request::AppendRedo(append).encode_body();
    assert!(Request::decode(Opcode::AppendRedo, &body[..body.len() - 1]).is_err(), "records cut short");
    let mut longer = body.clone();
    longer.push(0);
    assert!(Request::decode(Opcode::AppendRedo, &longer).is_err(), "a byte after the records");
    let mut lying = body.clone();
    lying[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Request::decode(Opcode::AppendRedo, &lying).is_err(), "a length past the body");
}
