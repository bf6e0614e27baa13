//! Property tests: any bytes fed to the frame, hello, request and reply parsers give a value or
//! an error, never a panic; whatever is encoded decodes to itself.

use proptest::prelude::*;
use tundra_proto::frame::{self, ClientHello, FrameHeader, HEADER_BYTES, ServerHello};
use tundra_proto::{MAX_BODY_BYTES, Opcode, Reply, Request, VolumeMode, WriteMode};

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
}

impl Fields {
    fn request(&self) -> Request<'_> {
        let (a, b) = self.numbers;
        let optional = self.present.then_some(self.volume);
        match self.opcode {
            Opcode::Ping => Request::Ping { payload: &self.data },
            Opcode::VolumeLookup => Request::VolumeLookup { name: &self.name },
            Opcode::VolumeCreate => {
                Request::VolumeCreate { name: &self.name, size_bytes: a, page_size: b as u32, mode: self.volume_mode }
            }
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
        }
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
    )
        .prop_map(|(opcode, name, data, volume, numbers, volume_mode, write_mode, present)| Fields {
            opcode,
            name,
            data,
            volume,
            numbers,
            volume_mode,
            write_mode,
            present,
        })
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
    }

    #[test]
    fn headers_round_trip(body_len in any::<u32>(), code in any::<u16>(), flags in any::<u16>(), request_id in any::<u64>(), crc in any::<u32>()) {
        let header = FrameHeader { body_len, code, flags, request_id, crc };
        prop_assert_eq!(FrameHeader::decode(&header.encode()), header);
    }
}
