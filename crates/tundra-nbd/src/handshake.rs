//! The fixed newstyle handshake: greeting, client flags, then option haggling until the client
//! picks an export (`NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`) or leaves.
//!
//! Every option is answered; options this server does not implement (`NBD_OPT_STARTTLS`,
//! `NBD_OPT_STRUCTURED_REPLY`, the metadata contexts, extended headers, anything unknown) get
//! `NBD_REP_ERR_UNSUP`, and option data over 64 KiB is drained and refused with
//! `NBD_REP_ERR_TOO_BIG`. A client that breaks the protocol (bad magic, unknown client flags, no
//! fixed newstyle, an `NBD_OPT_EXPORT_NAME` that cannot be served) is disconnected.

use std::io::{self, BufRead, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::connection::Close;
use crate::export::{Export, Exports};
use crate::proto::{self, Cursor};

/// The export a client chose, with what it was told about it.
pub(crate) struct Negotiated {
    /// The export's canonical name (the default export's own name when the client sent none).
    pub name: String,
    pub export: Arc<dyn Export>,
    /// The size sent to the client; requests are checked against it.
    pub size: u64,
}

/// Runs the handshake. `Ok(None)` when the client aborted or the server is stopping.
pub(crate) fn negotiate<R: BufRead, W: Write>(
    reader: &mut R,
    writer: &mut W,
    exports: &dyn Exports,
    stopping: &AtomicBool,
    entering: &dyn Fn(),
) -> Result<Option<Negotiated>, Close> {
    writer.write_all(&proto::NBD_MAGIC.to_be_bytes())?;
    writer.write_all(&proto::IHAVEOPT.to_be_bytes())?;
    writer.write_all(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes())?;
    writer.flush()?;

    let client_flags = read_u32(reader)?;
    if client_flags & !proto::CLIENT_FLAGS_KNOWN != 0 {
        return Err(Close::Violation(format!("unknown client flags {client_flags:#x}")));
    }
    if client_flags & proto::FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(Close::Violation("client does not speak fixed newstyle".into()));
    }
    let no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;

    let mut haggler = Haggler { writer, exports, no_zeroes, entering };
    loop {
        let magic = read_u64(reader)?;
        if magic != proto::IHAVEOPT {
            return Err(Close::Violation(format!("bad option magic {magic:#x}")));
        }
        let option = read_u32(reader)?;
        let len = read_u32(reader)?;
        if len > proto::MAX_OPTION_LEN {
            drain(reader, u64::from(len))?;
            if option == proto::OPT_EXPORT_NAME {
                return Err(Close::Violation(format!("export name of {len} bytes")));
            }
            haggler.reply_text(
                option,
                proto::REP_ERR_TOO_BIG,
                &format!("option data of {len} bytes is over 64 KiB"),
            )?;
            haggler.writer.flush()?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        reader.read_exact(&mut data)?;
        if stopping.load(Ordering::Relaxed) && option != proto::OPT_ABORT {
            haggler.reply_text(option, proto::REP_ERR_SHUTDOWN, "the server is shutting down")?;
            haggler.writer.flush()?;
            return Ok(None);
        }
        match haggler.option(option, &data)? {
            Step::Continue => {}
            Step::Abort => return Ok(None),
            Step::Transmit(negotiated) => return Ok(Some(negotiated)),
        }
    }
}

/// What the handshake does after an option.
enum Step {
    Continue,
    Abort,
    Transmit(Negotiated),
}

struct Haggler<'a, W> {
    writer: &'a mut W,
    exports: &'a dyn Exports,
    no_zeroes: bool,
    /// Called just before the reply that enters transmission, so the server counts the
    /// connection as negotiated before the client can know it is.
    entering: &'a dyn Fn(),
}

impl<W: Write> Haggler<'_, W> {
    fn option(&mut self, option: u32, data: &[u8]) -> Result<Step, Close> {
        let step = match option {
            proto::OPT_EXPORT_NAME => return self.export_name(data).map(Step::Transmit),
            proto::OPT_ABORT => {
                // The client may already have closed its end; a failed ACK changes nothing.
                let _ = self.reply(option, proto::REP_ACK, &[]).and_then(|()| self.writer.flush());
                return Ok(Step::Abort);
            }
            proto::OPT_LIST => {
                self.list(data)?;
                Step::Continue
            }
            proto::OPT_INFO | proto::OPT_GO => self.info(option, data)?,
            _ => {
                self.reply_text(option, proto::REP_ERR_UNSUP, &format!("option {option} is not supported"))?;
                Step::Continue
            }
        };
        self.writer.flush()?;
        Ok(step)
    }

    /// `NBD_OPT_EXPORT_NAME`: no way to report an error, so an unknown export closes.
    fn export_name(&mut self, data: &[u8]) -> Result<Negotiated, Close> {
        let name = std::str::from_utf8(data).map_err(|_| Close::Violation("export name is not UTF-8".into()))?;
        let Some((canonical, export)) = resolve(self.exports, name) else {
            return Err(Close::Violation(format!("NBD_OPT_EXPORT_NAME for unknown export {name:?}")));
        };
        let size = export.size();
        (self.entering)();
        self.writer.write_all(&size.to_be_bytes())?;
        self.writer.write_all(&proto::TRANSMISSION_FLAGS.to_be_bytes())?;
        if !self.no_zeroes {
            self.writer.write_all(&[0u8; proto::EXPORT_NAME_PADDING_LEN])?;
        }
        self.writer.flush()?;
        Ok(Negotiated { name: canonical, export, size })
    }

    fn list(&mut self, data: &[u8]) -> io::Result<()> {
        if !data.is_empty() {
            return self.reply_text(proto::OPT_LIST, proto::REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
        }
        for (name, description) in self.exports.list() {
            let description = truncated(&description);
            let mut payload = Vec::with_capacity(4 + name.len() + description.len());
            payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
            payload.extend_from_slice(name.as_bytes());
            payload.extend_from_slice(description.as_bytes());
            self.reply(proto::OPT_LIST, proto::REP_SERVER, &payload)?;
        }
        self.reply(proto::OPT_LIST, proto::REP_ACK, &[])
    }

    /// `NBD_OPT_INFO` and `NBD_OPT_GO`: the export's size and flags, its block sizes, and its
    /// name and description when asked; GO then enters transmission.
    fn info(&mut self, option: u32, data: &[u8]) -> io::Result<Step> {
        let (name, requests) = match parse_info_request(data) {
            Ok(parsed) => parsed,
            Err(message) => {
                self.reply_text(option, proto::REP_ERR_INVALID, message)?;
                return Ok(Step::Continue);
            }
        };
        let Some((canonical, export)) = resolve(self.exports, &name) else {
            let message = if name.is_empty() { "no default export".to_owned() } else { format!("no export {name:?}") };
            self.reply_text(option, proto::REP_ERR_UNKNOWN, &message)?;
            return Ok(Step::Continue);
        };
        let size = export.size();
        let mut info = Vec::with_capacity(14);
        info.extend_from_slice(&proto::INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&size.to_be_bytes());
        info.extend_from_slice(&proto::TRANSMISSION_FLAGS.to_be_bytes());
        self.reply(option, proto::REP_INFO, &info)?;

        // Sent even unasked: the preferred size is worth knowing, and the minimum of 1 and the
        // maximum of 32 MiB are no stricter than the defaults a client assumes.
        info.clear();
        info.extend_from_slice(&proto::INFO_BLOCK_SIZE.to_be_bytes());
        info.extend_from_slice(&proto::MIN_BLOCK_BYTES.to_be_bytes());
        info.extend_from_slice(&proto::advertised_preferred_block_size(export.preferred_block_size()).to_be_bytes());
        info.extend_from_slice(&proto::MAX_REQUEST_BYTES.to_be_bytes());
        self.reply(option, proto::REP_INFO, &info)?;

        if requests.contains(&proto::INFO_NAME) {
            self.reply_info_string(option, proto::INFO_NAME, &canonical)?;
        }
        if requests.contains(&proto::INFO_DESCRIPTION) {
            let description = self.exports.list().into_iter().find(|(listed, _)| *listed == canonical);
            if let Some((_, description)) = description.filter(|(_, description)| !description.is_empty()) {
                self.reply_info_string(option, proto::INFO_DESCRIPTION, truncated(&description))?;
            }
        }
        if option == proto::OPT_GO {
            (self.entering)();
        }
        self.reply(option, proto::REP_ACK, &[])?;
        Ok(if option == proto::OPT_GO {
            Step::Transmit(Negotiated { name: canonical, export, size })
        } else {
            Step::Continue
        })
    }

    fn reply_info_string(&mut self, option: u32, info_type: u16, text: &str) -> io::Result<()> {
        let mut payload = Vec::with_capacity(2 + text.len());
        payload.extend_from_slice(&info_type.to_be_bytes());
        payload.extend_from_slice(text.as_bytes());
        self.reply(option, proto::REP_INFO, &payload)
    }

    fn reply_text(&mut self, option: u32, reply_type: u32, message: &str) -> io::Result<()> {
        self.reply(option, reply_type, truncated(message).as_bytes())
    }

    fn reply(&mut self, option: u32, reply_type: u32, payload: &[u8]) -> io::Result<()> {
        let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("option reply over 4 GiB"))?;
        self.writer.write_all(&proto::option_reply_header(option, reply_type, len))?;
        self.writer.write_all(payload)
    }
}

/// The export a name selects, with its canonical name: the empty name is the default export.
fn resolve(exports: &dyn Exports, name: &str) -> Option<(String, Arc<dyn Export>)> {
    let canonical = if name.is_empty() { exports.default_name()? } else { name.to_owned() };
    if canonical.is_empty() {
        return None;
    }
    let export = exports.lookup(&canonical)?;
    Some((canonical, export))
}

/// Parses the data of `NBD_OPT_INFO` and `NBD_OPT_GO`: a name, then the information types asked.
fn parse_info_request(data: &[u8]) -> Result<(String, Vec<u16>), &'static str> {
    let mut cursor = Cursor(data);
    let name_len = cursor.u32().ok_or("option data too short for a name length")? as usize;
    if name_len > proto::MAX_STRING_LEN {
        return Err("export name longer than 4096 bytes");
    }
    let name = cursor.bytes(name_len).ok_or("name length past the end of the option data")?;
    let name = std::str::from_utf8(name).map_err(|_| "export name is not UTF-8")?;
    let count = cursor.u16().ok_or("option data too short for the information count")?;
    if cursor.remaining() != 2 * usize::from(count) {
        return Err("information count does not match the option data length");
    }
    let mut requests = Vec::with_capacity(usize::from(count));
    while let Some(request) = cursor.u16() {
        requests.push(request);
    }
    Ok((name.to_owned(), requests))
}

/// `text` cut to the protocol's longest string, at a character boundary.
fn truncated(text: &str) -> &str {
    if text.len() <= proto::MAX_STRING_LEN {
        return text;
    }
    let mut end = proto::MAX_STRING_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn read_u32<R: Read>(reader: &mut R) -> io::Result<u32> {
    let mut bytes = [0u8; 4];
    reader.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

fn read_u64<R: Read>(reader: &mut R) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    reader.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

/// Reads and discards `len` bytes, without holding them in memory.
pub(crate) fn drain<R: Read>(reader: &mut R, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut reader.take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stream ended inside a payload"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for request in requests {
            data.extend_from_slice(&request.to_be_bytes());
        }
        data
    }

    #[test]
    fn info_request_parses() {
        let data = info_data("vol", &[proto::INFO_NAME, proto::INFO_BLOCK_SIZE]);
        assert_eq!(parse_info_request(&data), Ok(("vol".to_owned(), vec![proto::INFO_NAME, proto::INFO_BLOCK_SIZE])));
        assert_eq!(parse_info_request(&info_data("", &[])), Ok((String::new(), vec![])));
    }

    #[test]
    fn malformed_info_requests_are_refused() {
        assert!(parse_info_request(&[]).is_err());
        assert!(parse_info_request(&[0, 0, 0, 9, b'a']).is_err());
        let mut data = info_data("vol", &[1]);
        data.push(0);
        assert!(parse_info_request(&data).is_err());
        let mut data = info_data("vol", &[1, 2]);
        data.truncate(data.len() - 2);
        assert!(parse_info_request(&data).is_err());
        assert!(parse_info_request(&info_data("\u{0}\u{ff}", &[])).is_ok());
        let mut bad_utf8 = info_data("ab", &[]);
        bad_utf8[4] = 0xff;
        assert!(parse_info_request(&bad_utf8).is_err());
        let mut huge_name = Vec::new();
        huge_name.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&huge_name).is_err());
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let text = "é".repeat(3000);
        let cut = truncated(&text);
        assert!(cut.len() <= proto::MAX_STRING_LEN);
        assert_eq!(cut.len(), 4096);
        let text = format!("a{}", "é".repeat(3000));
        assert_eq!(truncated(&text).len(), 4095);
    }
}
