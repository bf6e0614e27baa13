//! The client's calls of protocol version 2: a writer's redo appends, reads of pages as of an
//! LSN, a reader's lease, a volume's watermarks. Each maps the reply to its type and the
//! refusals a caller acts on to their own errors (`TooOld`, `NotYet`, `LeaseLost`); an append's
//! `Gap` and `Fenced` are outcomes, not errors.
//!
//! A page served outside the LSNs the read allowed, or newer than the LSN it was served at,
//! would be a wrong page handed over silently: the blocking reads check both and treat a
//! breach as a broken server.

use tundra_proto::{
    AppendOutcome, LeaseRenewal, Opcode, PageList, PageRead, PagesRead, ReadAt, ReaderLease, RedoAppend, RedoStatus,
    Reply, Request, ServedPage, ServedPages,
};

use crate::{Client, Error, RequestId, Result, unexpected};

impl Client {
    /// True when the connection speaks version 2, whose redo calls these are.
    pub fn supports_redo(&self) -> bool {
        self.version() >= Opcode::AppendRedo.since()
    }

    /// Appends a batch to the volume's redo stream; returns once the node has made it durable
    /// (`Ok`), or says why it did not take it (`Gap`: resend from `expected_prev_lsn`;
    /// `Fenced`: a writer of a higher epoch owns the stream, stop).
    pub fn append_redo(&mut self, append: &RedoAppend<'_>) -> Result<AppendOutcome> {
        let id = self.submit_append_redo(append)?;
        self.wait_appended(id)
    }

    /// Sends an append without waiting; several batches may be in flight, in LSN order.
    pub fn submit_append_redo(&mut self, append: &RedoAppend<'_>) -> Result<RequestId> {
        self.submit(Request::AppendRedo(*append))
    }

    /// Waits for the outcome of an append submitted earlier.
    pub fn wait_appended(&mut self, id: RequestId) -> Result<AppendOutcome> {
        match self.wait(id)? {
            Reply::Appended(outcome) => Ok(outcome),
            other => Err(unexpected(Opcode::AppendRedo, &other)),
        }
    }

    /// The volume's writer epoch and its durable, complete and minimum reader LSNs.
    pub fn redo_status(&mut self, volume: u32) -> Result<RedoStatus> {
        match self.call(Request::RedoStatus { volume })? {
            Reply::RedoStatus(status) => Ok(status),
            other => Err(unexpected(Opcode::RedoStatus, &other)),
        }
    }

    /// The page as of `at`: the LSN it was served at, the page's own LSN and its bytes.
    pub fn get_page_at_lsn(&mut self, volume: u32, page: u64, at: ReadAt) -> Result<ServedPage> {
        let id = self.submit_get_page_at_lsn(volume, page, at)?;
        let served = self.wait_page_at_lsn(id)?;
        self.check_served(at, served.served_lsn, &[served.page_lsn])?;
        Ok(served)
    }

    pub fn submit_get_page_at_lsn(&mut self, volume: u32, page: u64, at: ReadAt) -> Result<RequestId> {
        self.submit(Request::GetPageAtLsn(PageRead { volume, page, at }))
    }

    /// Waits for a page submitted earlier. The caller checks the LSNs against its read
    /// ([`ReadAt::admits`]), as [`Client::get_page_at_lsn`] does.
    pub fn wait_page_at_lsn(&mut self, id: RequestId) -> Result<ServedPage> {
        match self.wait(id)? {
            Reply::PageAtLsn(page) => Ok(page),
            other => Err(unexpected(Opcode::GetPageAtLsn, &other)),
        }
    }

    /// Up to [`tundra_proto::MAX_PAGES_PER_READ`] pages of one volume, all as of one LSN (a
    /// prefetch); all or nothing.
    pub fn get_pages_at_lsn(&mut self, volume: u32, pages: &[u64], at: ReadAt) -> Result<ServedPages> {
        let id = self.submit_get_pages_at_lsn(volume, pages, at)?;
        let served = self.wait_pages_at_lsn(id)?;
        if served.len() != pages.len() {
            let message = format!("{} pages asked for, {} served", pages.len(), served.len());
            return Err(self.lose(Error::Protocol(message)));
        }
        self.check_served(at, served.served_lsn, &served.page_lsns)?;
        Ok(served)
    }

    pub fn submit_get_pages_at_lsn(&mut self, volume: u32, pages: &[u64], at: ReadAt) -> Result<RequestId> {
        self.submit(Request::GetPagesAtLsn(PagesRead { volume, pages: PageList::Numbers(pages), at }))
    }

    pub fn wait_pages_at_lsn(&mut self, id: RequestId) -> Result<ServedPages> {
        match self.wait(id)? {
            Reply::PagesAtLsn(pages) => Ok(pages),
            other => Err(unexpected(Opcode::GetPagesAtLsn, &other)),
        }
    }

    /// Takes a lease on the volume's history from `start_lsn` on. A reader that registers
    /// again with the same `reader_id` replaces its old lease.
    pub fn register_reader(&mut self, volume: u32, reader_id: u64, start_lsn: u64) -> Result<ReaderLease> {
        match self.call(Request::RegisterReader { volume, reader_id, start_lsn })? {
            Reply::Lease(lease) => Ok(lease),
            other => Err(unexpected(Opcode::RegisterReader, &other)),
        }
    }

    /// Extends the lease, telling the node how far the reader has applied redo.
    pub fn renew_reader(&mut self, volume: u32, lease_id: u64, apply_lsn: u64) -> Result<LeaseRenewal> {
        match self.call(Request::RenewReader { volume, lease_id, apply_lsn })? {
            Reply::Renewed(renewal) => Ok(renewal),
            other => Err(unexpected(Opcode::RenewReader, &other)),
        }
    }

    /// Ends the lease; one that is gone already is not an error.
    pub fn release_reader(&mut self, volume: u32, lease_id: u64) -> Result<()> {
        match self.call(Request::ReleaseReader { volume, lease_id })? {
            Reply::Done => Ok(()),
            other => Err(unexpected(Opcode::ReleaseReader, &other)),
        }
    }

    /// Refuses, as a broken server, pages served outside what `at` allowed or newer than the
    /// LSN they were served at.
    fn check_served(&mut self, at: ReadAt, served_lsn: u64, page_lsns: &[u64]) -> Result<()> {
        let newer = page_lsns.iter().find(|&&page_lsn| page_lsn > served_lsn);
        if at.admits(served_lsn) && newer.is_none() {
            return Ok(());
        }
        let message = format!(
            "a read at LSN {} (not modified since {}) was served at {served_lsn} with page LSNs {page_lsns:?}",
            at.request_lsn, at.not_modified_since
        );
        Err(self.lose(Error::Protocol(message)))
    }
}
