//! The field vocabulary every body is written in: little-endian integers, length-prefixed
//! strings, optional values as a presence byte and a fixed-width value. [`Cursor`] reads fields
//! off a body front to back and turns every shortfall into a [`DecodeError`], never a panic:
//! the bytes come from the network.

use crate::codes::Opcode;
use crate::message::DecodeError;
use crate::types::{VolumeInfo, VolumeMode};

/// Longest string a body can carry: its length is a u16.
pub const MAX_STRING_BYTES: usize = u16::MAX as usize;

/// Reads fields off a body, front to back.
pub(crate) struct Cursor<'a> {
    opcode: Opcode,
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(opcode: Opcode, bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { opcode, bytes }
    }

    pub(crate) fn error(&self, message: impl Into<String>) -> DecodeError {
        DecodeError { opcode: self.opcode, message: message.into() }
    }

    fn take<const N: usize>(&mut self, field: &str) -> Result<[u8; N], DecodeError> {
        let Some((head, rest)) = self.bytes.split_first_chunk::<N>() else {
            return Err(self.error(format!("the body ends inside {field}")));
        };
        self.bytes = rest;
        Ok(*head)
    }

    pub(crate) fn u8(&mut self, field: &str) -> Result<u8, DecodeError> {
        Ok(self.take::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(field)?))
    }

    pub(crate) fn u32(&mut self, field: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(field)?))
    }

    pub(crate) fn u64(&mut self, field: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(field)?))
    }

    /// The next `len` bytes, refused before anything is copied when the body is shorter.
    pub(crate) fn bytes(&mut self, len: usize, field: &str) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < len {
            return Err(self.error(format!("{field} is {len} bytes but the body has {} left", self.bytes.len())));
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    pub(crate) fn str(&mut self, field: &str) -> Result<&'a str, DecodeError> {
        let len = usize::from(self.u16(field)?);
        let text = self.bytes(len, field)?;
        std::str::from_utf8(text).map_err(|_| self.error(format!("{field} is not UTF-8")))
    }

    /// A u8 presence flag (0 or 1) and a u32; an absent value must be sent as 0, so that one
    /// value has one encoding.
    pub(crate) fn optional_u32(&mut self, field: &str) -> Result<Option<u32>, DecodeError> {
        let present = self.u8(field)?;
        let value = self.u32(field)?;
        self.optional(present, value == 0, field).map(|present| present.then_some(value))
    }

    /// A u8 presence flag (0 or 1) and a u64, as [`Cursor::optional_u32`].
    pub(crate) fn optional_u64(&mut self, field: &str) -> Result<Option<u64>, DecodeError> {
        let present = self.u8(field)?;
        let value = self.u64(field)?;
        self.optional(present, value == 0, field).map(|present| present.then_some(value))
    }

    fn optional(&self, present: u8, zero: bool, field: &str) -> Result<bool, DecodeError> {
        match present {
            0 if zero => Ok(false),
            0 => Err(self.error(format!("an absent {field} must be sent as 0"))),
            1 => Ok(true),
            other => Err(self.error(format!("the presence flag of {field} is {other}, neither 0 nor 1"))),
        }
    }

    pub(crate) fn volume_mode(&mut self) -> Result<VolumeMode, DecodeError> {
        let code = self.u8("the volume mode")?;
        VolumeMode::from_code(code).ok_or_else(|| self.error(format!("unknown volume mode {code}")))
    }

    pub(crate) fn volume_info(&mut self) -> Result<VolumeInfo, DecodeError> {
        let id = self.u32("the volume id")?;
        let size_bytes = self.u64("the volume size")?;
        let page_size = self.u32("the page size")?;
        let mode = self.volume_mode()?;
        let name = self.str("the volume name")?.to_string();
        Ok(VolumeInfo { id, name, size_bytes, page_size, mode })
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if !self.bytes.is_empty() {
            return Err(self.error(format!("{} unexpected bytes after the last field", self.bytes.len())));
        }
        Ok(())
    }
}

pub(crate) fn put_u16(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Writes a length-prefixed string. Longer strings are the caller's bug: names are checked
/// before they are sent (the client refuses them as invalid).
pub(crate) fn put_str(out: &mut Vec<u8>, text: &str) {
    let len = u16::try_from(text.len()).expect("strings on the wire are at most 65535 bytes");
    put_u16(out, len);
    out.extend_from_slice(text.as_bytes());
}

pub(crate) fn put_optional_u32(out: &mut Vec<u8>, value: Option<u32>) {
    out.push(u8::from(value.is_some()));
    put_u32(out, value.unwrap_or(0));
}

pub(crate) fn put_optional_u64(out: &mut Vec<u8>, value: Option<u64>) {
    out.push(u8::from(value.is_some()));
    put_u64(out, value.unwrap_or(0));
}
