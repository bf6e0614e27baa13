//! The handshake against the hand-written client: greeting, options, export selection, and the
//! cases that must close the connection or leave it open.

mod common;

use common::*;

#[test]
fn go_reports_size_flags_block_sizes_name_and_description() {
    let fixture = Fixture::start(MIB);
    let mut client = Client::connect(fixture.addr());
    let replies = client.info(OPT_GO, "vol", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]);
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);
    assert!(replies.iter().all(|reply| reply.option == OPT_GO));
    assert_eq!(client.size, MIB);
    assert_eq!(client.transmission_flags, EXPECTED_TRANSMISSION_FLAGS);
    let info = |kind: u16| {
        replies
            .iter()
            .find(|reply| reply.reply_type == REP_INFO && reply.data[..2] == kind.to_be_bytes())
            .map(|reply| reply.data[2..].to_vec())
    };
    let block_sizes = info(INFO_BLOCK_SIZE).expect("block sizes");
    assert_eq!(block_sizes[0..4], 1u32.to_be_bytes(), "minimum");
    assert_eq!(block_sizes[4..8], 16384u32.to_be_bytes(), "preferred: the export's page size");
    assert_eq!(block_sizes[8..12], (32 * 1024 * 1024u32).to_be_bytes(), "maximum");
    assert_eq!(info(INFO_NAME).as_deref(), Some(&b"vol"[..]));
    assert_eq!(info(INFO_DESCRIPTION).as_deref(), Some(&b"the test volume"[..]));
    // In transmission now.
    assert_eq!(client.read(0, 512), Ok(vec![0u8; 512]));
    client.disconnect();
}

#[test]
fn info_leaves_negotiation_open_and_the_empty_name_is_the_default() {
    let fixture = Fixture::start(MIB);
    let mut client = Client::connect(fixture.addr());
    let replies = client.info(OPT_INFO, "small", &[]);
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);
    assert_eq!(client.size, 64 * 1024);
    let replies = client.info(OPT_INFO, "", &[INFO_NAME]);
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);
    assert_eq!(client.size, MIB);
    assert!(replies.iter().any(|reply| reply.reply_type == REP_INFO && reply.data == b"\0\x01vol"));
    client.info(OPT_GO, "", &[]);
    assert_eq!(client.size, MIB);
    assert_eq!(client.write(0, 0, b"default"), 0);
    assert_eq!(fixture.vol.bytes_at(0, 7), b"default");
}

#[test]
fn unknown_export_is_an_error_reply_and_negotiation_continues() {
    let fixture = Fixture::start(MIB);
    let mut client = Client::connect(fixture.addr());
    for option in [OPT_INFO, OPT_GO] {
        let replies = client.info(option, "nope", &[]);
        assert_eq!(replies.len(), 1, "no NBD_REP_INFO before the error");
        assert_eq!(replies[0].reply_type, REP_ERR_UNKNOWN);
        assert!(String::from_utf8_lossy(&replies[0].data).contains("nope"));
    }
    fixture.exports.set_default(None);
    assert_eq!(client.info(OPT_GO, "", &[])[0].reply_type, REP_ERR_UNKNOWN);
    let replies = client.info(OPT_GO, "small", &[]);
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);
    client.disconnect();
}

#[test]
fn export_name_option_with_and_without_zero_padding() {
    let fixture = Fixture::start(MIB);
    for no_zeroes in [true, false] {
        let mut client = Client::greet(fixture.addr());
        client.send_bytes(&(if no_zeroes { 3u32 } else { 1u32 }).to_be_bytes());
        client.send_option(OPT_EXPORT_NAME, b"small");
        assert_eq!(client.u64(), 64 * 1024);
        assert_eq!(client.u16(), EXPECTED_TRANSMISSION_FLAGS);
        if !no_zeroes {
            assert_eq!(client.bytes(124), vec![0u8; 124]);
        }
        assert_eq!(client.read(0, 4), Ok(vec![0u8; 4]));
        client.disconnect();
    }
}

#[test]
fn export_name_option_for_an_unknown_export_closes_the_connection() {
    let fixture = Fixture::start(MIB);
    let mut client = Client::connect(fixture.addr());
    client.send_option(OPT_EXPORT_NAME, b"nope");
    client.expect_closed();
    wait_for(|| fixture.server.stats().protocol_errors == 1);
    let error = fixture.server.last_protocol_error().expect("a recorded violation");
    assert!(error.contains("nope"), "{error}");
    // The server is still there.
    Client::go(fixture.addr(), "vol").disconnect();
}

#[test]
fn list_names_every_export_with_its_description() {
    let fixture = Fixture::start(MIB);
    let mut client = Client::connect(fixture.addr());
    client.send_option(OPT_LIST, &[]);
    let replies = client.option_replies();
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);
    let mut listed = Vec::new();
    for reply in &replies[..replies.len() - 1] {
        assert_eq!(reply.reply_type, REP_SERVER);
        let name_len = u32::from_be_bytes(reply.data[..4].try_into().unwrap()) as usize;
        let name = String::from_utf8(reply.data[4..4 + name_len].to_vec()).unwrap();
        let description = String::from_utf8(reply.data[4 + name_len..].to_vec()).unwrap();
        listed.push((name, description));
    }
    assert_eq!(listed, [("small".to_owned(), String::new()), ("vol".to_owned(), "the test volume".to_owned())]);

    client.send_option(OPT_LIST, b"junk");
    assert_eq!(client.option_reply().reply_type, REP_ERR_INVALID);
    client.info(OPT_GO, "vol", &[]);
    client.disconnect();
}

#[test]
fn unsupported_malformed_and_oversized_options_get_errors() {
    let fixture = Fixture::start(MIB);
    let mut client = Client::connect(fixture.addr());
    for option in [OPT_STRUCTURED_REPLY, OPT_STARTTLS, OPT_SET_META_CONTEXT, OPT_EXTENDED_HEADERS, 4, 99, u32::MAX] {
        client.send_option(option, &[]);
        let reply = client.option_reply();
        assert_eq!((reply.option, reply.reply_type), (option, REP_ERR_UNSUP), "option {option}");
    }
    // A GO whose name length points past its data, and one with a trailing byte.
    client.send_option(OPT_GO, &[0, 0, 0, 200, b'v']);
    assert_eq!(client.option_reply().reply_type, REP_ERR_INVALID);
    client.send_option(OPT_INFO, &[0, 0, 0, 0, 0, 0, 9]);
    assert_eq!(client.option_reply().reply_type, REP_ERR_INVALID);
    // Over 64 KiB of option data: drained and refused, and the stream stays in step.
    client.send_option(OPT_GO, &vec![0u8; 64 * 1024 + 1]);
    assert_eq!(client.option_reply().reply_type, REP_ERR_TOO_BIG);
    client.send_option(99, &vec![7u8; 3 * 1024 * 1024]);
    assert_eq!(client.option_reply().reply_type, REP_ERR_TOO_BIG);
    let replies = client.info(OPT_GO, "vol", &[]);
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);
    client.disconnect();
    assert_eq!(fixture.server.stats().protocol_errors, 0);
}

#[test]
fn abort_is_acknowledged_then_closed() {
    let fixture = Fixture::start(MIB);
    let mut client = Client::connect(fixture.addr());
    client.send_option(OPT_ABORT, &[]);
    let reply = client.option_reply();
    assert_eq!((reply.option, reply.reply_type), (OPT_ABORT, REP_ACK));
    client.expect_closed();
}

#[test]
fn bad_client_flags_and_bad_option_magic_close_the_connection() {
    let fixture = Fixture::start(MIB);
    // An unknown client flag, then a client without fixed newstyle.
    for flags in [1u32 | 4, 0, 2] {
        let mut client = Client::greet(fixture.addr());
        client.send_bytes(&flags.to_be_bytes());
        client.expect_closed();
    }
    let mut client = Client::connect(fixture.addr());
    client.send_bytes(&[0xee; 16]);
    client.expect_closed();
    // A client that hangs up in the middle of an option.
    let mut client = Client::connect(fixture.addr());
    client.send_bytes(&IHAVEOPT.to_be_bytes());
    drop(client);
    wait_for(|| fixture.server.stats().connections_open == 0);
    assert_eq!(fixture.server.stats().protocol_errors, 4);
    Client::go(fixture.addr(), "vol").disconnect();
}

#[test]
fn exports_added_and_removed_while_running() {
    let fixture = Fixture::start(MIB);
    let extra = std::sync::Arc::new(tundra_nbd::mem::MemExport::new(8192));
    fixture.exports.insert("extra", "added later", extra.clone());
    let mut client = Client::go(fixture.addr(), "extra");
    assert_eq!(client.size, 8192);
    assert!(fixture.exports.remove("extra"));
    // The open connection keeps its export; a new one cannot select it.
    assert_eq!(client.write(0, 0, b"still"), 0);
    assert_eq!(extra.bytes_at(0, 5), b"still");
    let mut other = Client::connect(fixture.addr());
    assert_eq!(other.info(OPT_GO, "extra", &[])[0].reply_type, REP_ERR_UNKNOWN);
    client.disconnect();
}

/// Waits until `condition` holds, for effects the server makes after the client sees a close.
fn wait_for(condition: impl Fn() -> bool) {
    for _ in 0..2000 {
        if condition() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("condition not reached in 10 s");
}
