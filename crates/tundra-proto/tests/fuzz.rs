//! Property tests: any bytes fed to the frame, hello, request and reply parsers give a value or
//! an error, never a panic; whatever is encoded decodes to itself, version 2's redo requests
//! and replies included.

use proptest::prelude::*;
use tundra_proto::frame::{self, ClientHello, FrameHeader, HEADER_BYTES, ServerHello};
use tundra_proto::message::decode_refusal;
use tundra_proto::{
    AppendOutcome, LeaseRenewal, MAX_BODY_BYTES, MAX_PAGES_PER_READ, Opcode, PageList, PageRead, PagesRead, ReadAt,
    ReaderLease, RedoAppend, RedoStatus, Reply, Request, ServedPage, ServedPages, Status, VolumeMode, WriteMode,
};

fn opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(Opcode::ALL.to_vec())
}

fn volume_mode() -> impl Strategy<Value = VolumeMode> {
    prop::sample::select(vec![VolumeMode::Normal, VolumeMode::None])
}

fn write_mode() -> impl Strategy<Value = WriteMode> {
    prop::sample::select(WriteMode::ALL.to_vec())
}

/// The owned fields of a request, which the strategy generates and `Request` borrows.
#[derive(Clone, Debug)]
struct Fields {
    opcode: Opcode,
    name: String,
    data: Vec<u8>,
    volume: u32,
    numbers: (u64, u64),
    volume_mode: VolumeMode,
    write_mode: WriteMode,
    present: bool,
    /// The redo requests' further numbers: a third LSN, a record count, a lease.
    redo: (u64, u32, Option<u64>),
    pages: Vec<u64>,
}

impl Fields {
    fn request(&self) -> Request<'_> {
        let (a, b) = self.numbers;
        let optional = self.present.then_some(self.volume);
        match self.opcode {
            Opcode::Ping => Request::Ping { payload: &self.data },
            Opcode::VolumeLookup => Request::VolumeLookup { name: &self.name },
            Opcode::VolumeCreate => Request::VolumeCreate {
                name: &self.name,
                size_bytes: a,
                page_size: b as u32,
                mode: self.volume_mode,
                replicas: 1,
            },
            Opcode::VolumeList => Request::VolumeList,
            Opcode::VolumeResize => Request::VolumeResize { name: &self.name, size_bytes: a },
            Opcode::VolumeDelete => Request::VolumeDelete { name: &self.name },
            Opcode::ReadPage => Request::ReadPage { volume: self.volume, page: a },
            Opcode::WritePage => {
                Request::WritePage { volume: self.volume, page: a, mode: self.write_mode, data: &self.data }
            }
            Opcode::Trim => Request::Trim { volume: self.volume, first: a, count: b },
            Opcode::Flush => Request::Flush { volume: optional },
            Opcode::HeavyCompress => Request::HeavyCompress { volume: self.volume, first: a, count: b },
            Opcode::Stats => Request::Stats { volume: optional },
            Opcode::ClusterAdmin => Request::ClusterAdmin { request: &self.name },
            Opcode::AppendRedo => Request::AppendRedo(RedoAppend {
                volume: self.volume,
                writer_epoch: a,
                prev_lsn: b,
                end_lsn: self.redo.0,
                record_count: self.redo.1,
                records: &self.data,
            }),
            Opcode::RedoStatus => Request::RedoStatus { volume: self.volume },
            Opcode::GetPageAtLsn => Request::GetPageAtLsn(PageRead { volume: self.volume, page: a, at: self.at() }),
            Opcode::GetPagesAtLsn => Request::GetPagesAtLsn(PagesRead {
                volume: self.volume,
                pages: PageList::Numbers(&self.pages),
                at: self.at(),
            }),
            Opcode::RegisterReader => Request::RegisterReader { volume: self.volume, reader_id: a, start_lsn: b },
            Opcode::RenewReader => Request::RenewReader { volume: self.volume, lease_id: a, apply_lsn: b },
            Opcode::ReleaseReader => Request::ReleaseReader { volume: self.volume, lease_id: a },
        }
    }

    fn at(&self) -> ReadAt {
        ReadAt { request_lsn: self.numbers.1, not_modified_since: self.redo.0, lease: self.redo.2 }
    }
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        opcode(),
        ".{0,80}",
        prop::collection::vec(any::<u8>(), 0..600),
        any::<u32>(),
        (any::<u64>(), any::<u64>()),
        volume_mode(),
        write_mode(),
        any::<bool>(),
        (any::<u64>(), any::<u32>(), any::<Option<u64>>()),
        prop::collection::vec(any::<u64>(), 0..=MAX_PAGES_PER_READ),
    )
        .prop_map(|(opcode, name, data, volume, numbers, volume_mode, write_mode, present, redo, pages)| Fields {
            opcode,
            name,
            data,
            volume,
            numbers,
            volume_mode,
            write_mode,
            present,
            redo,
            pages,
        })
}

/// A successful reply of every redo opcode, from arbitrary numbers.
fn redo_reply(opcode: Opcode, numbers: (u64, u64, u64, u64), kind: u8, page_size: u32, count: usize) -> Option<Reply> {
    let (a, b, c, d) = numbers;
    let reply = match opcode {
        Opcode::AppendRedo => Reply::Appended(match kind % 3 {
            0 => AppendOutcome::Ok { durable_lsn: a },
            1 => AppendOutcome::Gap { expected_prev_lsn: a },
            _ => AppendOutcome::Fenced { epoch: a },
        }),
        Opcode::RedoStatus => {
            Reply::RedoStatus(RedoStatus { writer_epoch: a, durable_lsn: b, complete_lsn: c, lsn_min: d })
        }
        Opcode::GetPageAtLsn => {
            Reply::PageAtLsn(ServedPage { served_lsn: a, page_lsn: b, data: vec![kind; page_size as usize] })
        }
        Opcode::GetPagesAtLsn => Reply::PagesAtLsn(ServedPages {
            served_lsn: a,
            page_size,
            page_lsns: (0..count as u64).map(|i| b.wrapping_add(i)).collect(),
            data: vec![kind; page_size as usize * count],
        }),
        Opcode::RegisterReader => Reply::Lease(ReaderLease { lease_id: a, granted_lsn: b, valid_for_ms: c }),
        Opcode::RenewReader => Reply::Renewed(LeaseRenewal { valid_for_ms: a, lsn_min: b }),
        Opcode::ReleaseReader => Reply::Done,
        _ => return None,
    };
    Some(reply)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_the_frame_decoder(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        // Walk the input as a server would: frame after frame until one is incomplete or bad.
        let mut rest = bytes.as_slice();
        while let Ok(Some((frame, used))) = frame::decode_frame(rest, MAX_BODY_BYTES) {
            prop_assert_eq!(used, HEADER_BYTES + frame.body.len());
            rest = &rest[used..];
        }
        // Small limits exercise the too-large path on every length.
        let _ = frame::decode_frame(&bytes, 16);
        if let Some(hello) = bytes.first_chunk() {
            let _ = ClientHello::decode(hello);
        }
        if let Some(hello) = bytes.first_chunk() {
            let _ = ServerHello::decode(hello);
        }
    }

    #[test]
    fn random_bodies_never_panic_the_body_decoders(opcode in opcode(), body in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Request::decode(opcode, &body);
        let _ = Reply::decode(opcode, body);
    }

    #[test]
    fn frames_with_valid_checksums_and_random_bodies_never_panic(code in any::<u16>(), id in any::<u64>(), body in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = Vec::new();
        frame::write_frame(&mut bytes, code, 0, id, &[&body]).unwrap();
        let (frame, _) = frame::decode_frame(&bytes, MAX_BODY_BYTES).unwrap().unwrap();
        prop_assert_eq!(frame.header.request_id, id);
        if let Some(opcode) = Opcode::from_code(frame.header.code) {
            let _ = Request::decode(opcode, frame.body);
        }
    }

    #[test]
    fn requests_round_trip(fields in fields()) {
        let request = fields.request();
        let body = request.encode_body();
        prop_assert_eq!(Request::decode(request.opcode(), &body), Ok(request));
        // Any strict prefix of a body with fixed fields fails instead of misreading.
        if !matches!(request, Request::Ping { .. } | Request::VolumeList | Request::WritePage { .. }) && !body.is_empty() {
            prop_assert!(Request::decode(request.opcode(), &body[..body.len() - 1]).is_err());
        }
        // A body with a byte more never decodes either: nothing is silently ignored.
        if !matches!(request, Request::Ping { .. } | Request::WritePage { .. }) {
            let mut longer = body.clone();
            longer.push(0);
            prop_assert!(Request::decode(request.opcode(), &longer).is_err());
        }
    }

    #[test]
    fn redo_replies_round_trip_and_refuse_cut_bodies(
        opcode in prop::sample::select(
            Opcode::ALL.iter().copied().filter(|o| o.since() == 2 && *o != Opcode::ClusterAdmin).collect::<Vec<_>>(),
        ),
        numbers in (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        kind in any::<u8>(),
        page_size in 0u32..300,
        count in 0..=MAX_PAGES_PER_READ,
    ) {
        let reply = redo_reply(opcode, numbers, kind, page_size, count).expect("a redo opcode");
        let mut body = Vec::new();
        reply.encode_body(&mut body);
        prop_assert_eq!(Reply::decode(opcode, body.clone()), Ok(reply));
        if !body.is_empty() {
            let cut = body[..body.len() - 1].to_vec();
            // A page reply's page has no length of its own: a cut one is a shorter page, which
            // the client checks against the volume. Every other cut is an error.
            if opcode != Opcode::GetPageAtLsn || body.len() <= 16 {
                prop_assert!(Reply::decode(opcode, cut).is_err());
            }
        }
    }

    #[test]
    fn refusal_bodies_never_panic(status in prop::sample::select(Status::ALL.to_vec()), body in prop::collection::vec(any::<u8>(), 0..40)) {
        let decoded = decode_refusal(Opcode::GetPageAtLsn, status, &body);
        prop_assert_eq!(decoded.is_ok(), !status.carries_lsn() || body.len() >= 8);
    }

    #[test]
    fn headers_round_trip(body_len in any::<u32>(), code in any::<u16>(), flags in any::<u16>(), request_id in any::<u64>(), crc in any::<u32>()) {
        let header = FrameHeader { body_len, code, flags, request_id, crc };
        prop_assert_eq!(FrameHeader::decode(&header.encode()), header);
    }
}
