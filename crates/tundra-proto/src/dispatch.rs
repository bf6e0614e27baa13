//! What the server does with one verified request frame: check the header's flags and id, the
//! opcode against the connection's version, decode the body, check the protocol's rules for its
//! arguments, call the [`Service`], and check what the service answers against the protocol's
//! promises before it goes out (a served LSN in range, no status the connection's version lacks).
//! A service's mistake becomes `INTERNAL`, never a reply the client would misread.

use std::panic::{self, AssertUnwindSafe};

use crate::codes::{Opcode, Status};
use crate::conn::KEEP_BYTES;
use crate::frame::{FrameHeader, MAX_BODY_BYTES, NOTICE_ID};
use crate::message::{Request, put_heavy_result, put_volume_info, put_volume_list};
use crate::redo::{BatchLsns, PageLsns, ReadAt, ServedPage, ServedPages};
use crate::service::{Service, ServiceError};
use crate::types::VolumeSpec;

/// A reply body in two parts sent one after the other: a head of fixed fields and the data
/// (pages) the service wrote, so that pages are never copied to make room for a head.
#[derive(Default)]
pub(crate) struct Reply {
    pub(crate) head: Vec<u8>,
    pub(crate) data: Vec<u8>,
}

impl Reply {
    fn clear(&mut self) {
        self.head.clear();
        self.data.clear();
    }

    fn len(&self) -> usize {
        self.head.len() + self.data.len()
    }

    /// Gives back buffers a large reply grew.
    pub(crate) fn shrink(&mut self) {
        for buffer in [&mut self.head, &mut self.data] {
            if buffer.capacity() > KEEP_BYTES {
                *buffer = Vec::new();
            }
        }
    }
}

/// Executes one request whose frame verified on a connection of protocol `version`; the reply
/// body goes to `reply`.
pub(crate) fn answer(
    service: &dyn Service,
    version: u16,
    header: FrameHeader,
    body: &[u8],
    reply: &mut Reply,
) -> Result<(), ServiceError> {
    reply.clear();
    if header.flags != 0 {
        return Err(ServiceError::invalid(format!("request flags {:#06x}: no version defines any", header.flags)));
    }
    if header.request_id == NOTICE_ID {
        return Err(ServiceError::invalid("request id 0 is reserved for the server's notices"));
    }
    let opcode = match Opcode::from_code(header.code) {
        Some(opcode) if opcode.since() <= version => opcode,
        Some(opcode) => {
            let message = format!(
                "opcode {} ({opcode}) belongs to protocol version {}; this connection speaks version {version}",
                header.code,
                opcode.since()
            );
            return Err(ServiceError::new(Status::UnknownOpcode, message));
        }
        None => {
            return Err(ServiceError::new(Status::UnknownOpcode, format!("opcode {} is not defined", header.code)));
        }
    };
    let request = Request::decode(opcode, body).map_err(|error| ServiceError::invalid(error.to_string()))?;
    if let Some(problem) = request.problem() {
        return Err(ServiceError::invalid(format!("{opcode}: {problem}")));
    }
    // A panicking service must not take the connection's thread (and the client's other
    // requests) with it; the panic message has gone to standard error already.
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| execute(service, request, reply)));
    let result = outcome.unwrap_or_else(|_| Err(ServiceError::internal(format!("the service panicked in {opcode}"))));
    match result {
        Ok(()) if reply.len() > MAX_BODY_BYTES as usize => {
            Err(ServiceError::internal(format!("the {opcode} reply of {} bytes is too large to send", reply.len())))
        }
        Err(error) => Err(checked_refusal(opcode, version, error)),
        ok => ok,
    }
}

/// A service's refusal as it may go out on this connection.
fn checked_refusal(opcode: Opcode, version: u16, error: ServiceError) -> ServiceError {
    let code = error.code;
    if code == Status::Ok {
        return ServiceError::internal(format!("the service refused {opcode} with status OK: {}", error.message));
    }
    if code.since() > version {
        return ServiceError::internal(format!(
            "the service refused {opcode} with {code}, which protocol version {version} lacks: {}",
            error.message
        ));
    }
    if code.carries_lsn() && error.lsn.is_none() {
        return ServiceError::internal(format!(
            "the service refused {opcode} with {code} but no LSN: {}",
            error.message
        ));
    }
    error
}

fn execute(service: &dyn Service, request: Request<'_>, reply: &mut Reply) -> Result<(), ServiceError> {
    let head = &mut reply.head;
    match request {
        Request::Ping { payload } => head.extend_from_slice(payload),
        Request::VolumeLookup { name } => put_volume_info(head, &service.volume_lookup(name)?),
        Request::VolumeCreate { name, size_bytes, page_size, mode, replicas } => {
            let spec = VolumeSpec { name: name.to_string(), size_bytes, page_size, mode };
            let info = match replicas {
                1 => service.volume_create(spec)?,
                _ => service.volume_create_replicated(spec, replicas)?,
            };
            put_volume_info(head, &info);
        }
        Request::VolumeList => put_volume_list(head, &service.volume_list()?),
        Request::VolumeResize { name, size_bytes } => put_volume_info(head, &service.volume_resize(name, size_bytes)?),
        Request::VolumeDelete { name } => service.volume_delete(name)?,
        Request::ReadPage { volume, page } => service.read_page(volume, page, &mut reply.data)?,
        Request::WritePage { volume, page, mode, data } => service.write_page(volume, page, mode, data)?,
        Request::Trim { volume, first, count } => service.trim(volume, first, count)?,
        Request::Flush { volume } => service.flush(volume)?,
        Request::HeavyCompress { volume, first, count } => {
            put_heavy_result(head, &service.heavy_compress(volume, first, count)?);
        }
        Request::Stats { volume } => head.extend_from_slice(service.stats(volume)?.as_bytes()),
        Request::ClusterAdmin { request } => head.extend_from_slice(service.cluster_admin(request)?.as_bytes()),
        Request::AppendRedo(append) => service.append_redo(&append)?.encode(head),
        Request::RedoStatus { volume } => service.redo_status(volume)?.encode(head),
        Request::GetPageAtLsn(read) => {
            let lsns = service.get_page_at_lsn(read.volume, read.page, read.at, &mut reply.data)?;
            check_page_lsns(read.at, lsns)?;
            ServedPage::encode_head(head, lsns);
        }
        Request::GetPagesAtLsn(read) => {
            let pages = read.pages.to_vec();
            let lsns = service.get_pages_at_lsn(read.volume, &pages, read.at, &mut reply.data)?;
            let page_size = check_batch(read.at, pages.len(), &lsns, reply.data.len())?;
            ServedPages::encode_head(head, lsns.served_lsn, page_size, &lsns.page_lsns);
        }
        Request::RegisterReader { volume, reader_id, start_lsn } => {
            service.register_reader(volume, reader_id, start_lsn)?.encode(head);
        }
        Request::RenewReader { volume, lease_id, apply_lsn } => {
            service.renew_reader(volume, lease_id, apply_lsn)?.encode(head);
        }
        Request::ReleaseReader { volume, lease_id } => service.release_reader(volume, lease_id)?,
    }
    Ok(())
}

/// A page served as of an LSN outside what the reader allowed, or newer than that LSN, would
/// be a silently wrong page: refuse to send it.
fn check_page_lsns(at: ReadAt, lsns: PageLsns) -> Result<(), ServiceError> {
    if !at.admits(lsns.served_lsn) {
        return Err(ServiceError::internal(format!(
            "the service served LSN {} for a read at {} not modified since {}",
            lsns.served_lsn, at.request_lsn, at.not_modified_since
        )));
    }
    if lsns.page_lsn > lsns.served_lsn {
        return Err(ServiceError::internal(format!(
            "the service served a page of LSN {} as of LSN {}",
            lsns.page_lsn, lsns.served_lsn
        )));
    }
    Ok(())
}

/// Checks a vectored answer and returns the page size it implies.
fn check_batch(at: ReadAt, count: usize, lsns: &BatchLsns, data_len: usize) -> Result<u32, ServiceError> {
    if lsns.page_lsns.len() != count || count == 0 || !data_len.is_multiple_of(count) {
        return Err(ServiceError::internal(format!(
            "the service answered {count} pages with {} page LSNs and {data_len} bytes",
            lsns.page_lsns.len()
        )));
    }
    for &page_lsn in &lsns.page_lsns {
        check_page_lsns(at, PageLsns { served_lsn: lsns.served_lsn, page_lsn })?;
    }
    u32::try_from(data_len / count).map_err(|_| ServiceError::internal("pages larger than 4 GiB"))
}
