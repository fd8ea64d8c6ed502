//! An in-memory LogDevice that records every write, for tests and models.
#![allow(dead_code)]

use iclog::format::{parse_record, Assembler, RecordCheck, Whole};
use iclog::{Config, DeviceError, IoFlags, LogDevice, Lsn};
use journal_sync::{Arc, Condvar, Mutex};

/// One device call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Write {
        lsn: Lsn,
        len: usize,
        flags: IoFlags,
    },
    Flush,
}

#[derive(Default)]
pub struct MemState {
    pub calls: Vec<Call>,
    /// Record bytes by LSN, as written.
    pub records: Vec<(Lsn, Vec<u8>)>,
    /// Writes at these LSNs block until released.
    pub gated: Vec<Lsn>,
    /// Writes currently blocked at a gate.
    pub blocked: Vec<Lsn>,
    /// Fail the write at this LSN.
    pub fail_at: Option<Lsn>,
    /// Fail the next flush.
    pub fail_flush: bool,
}

#[derive(Clone, Default)]
pub struct MemDevice {
    pub state: Arc<(Mutex<MemState>, Condvar)>,
}

#[derive(Debug)]
pub struct Injected;
impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected I/O error")
    }
}
impl std::error::Error for Injected {}

impl MemDevice {
    pub fn calls(&self) -> Vec<Call> {
        self.state.0.lock().calls.clone()
    }
    pub fn writes(&self) -> Vec<(Lsn, usize, IoFlags)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Write { lsn, len, flags } => Some((lsn, len, flags)),
                Call::Flush => None,
            })
            .collect()
    }
    pub fn gate(&self, lsn: Lsn) {
        self.state.0.lock().gated.push(lsn);
    }
    pub fn open_gate(&self, lsn: Lsn) {
        self.state.0.lock().gated.retain(|&l| l != lsn);
        self.state.1.notify_all();
    }
    /// Waits (on the device's condvar) until `pred` holds.
    pub fn wait_until(&self, pred: impl Fn(&MemState) -> bool) {
        let (m, cv) = &*self.state;
        let mut st = m.lock();
        while !pred(&st) {
            st = cv.wait(st);
        }
    }
    /// Every whole entry of every record written (chains reassembled), in
    /// LSN order, parsed and checked.
    pub fn entries(&self, cfg: &Config) -> Vec<(Lsn, Vec<u8>)> {
        let mut recs = self.state.0.lock().records.clone();
        recs.sort_by_key(|r| r.0);
        let mut out = Vec::new();
        let mut chains = Assembler::new();
        let mut expect = recs.first().map(|r| r.0);
        for (lsn, bytes) in &recs {
            assert_eq!(Some(*lsn), expect, "records are contiguous");
            match parse_record(bytes, *lsn, cfg.max_payload(), cfg.alignment) {
                RecordCheck::Valid(r) => {
                    assert_eq!(r.size as usize, bytes.len());
                    expect = Some(r.end());
                    let dropped = chains.feed(&r, |w| match w {
                        Whole::Single(l, b) => out.push((l, b.to_vec())),
                        Whole::Chained(l, b) => out.push((l, b)),
                    });
                    assert_eq!(dropped, Default::default(), "no chain was broken");
                }
                other => panic!("record at {lsn} does not parse: {other:?}"),
            }
        }
        assert_eq!(chains.pending(), None, "no chain left open");
        out
    }
}

impl LogDevice for MemDevice {
    type Error = DeviceError;
    fn write(&self, lsn: Lsn, bytes: &[u8], flags: IoFlags) -> Result<(), DeviceError> {
        let (m, cv) = &*self.state;
        let mut st = m.lock();
        if st.gated.contains(&lsn) {
            st.blocked.push(lsn);
            cv.notify_all();
            while st.gated.contains(&lsn) {
                st = cv.wait(st);
            }
            st.blocked.retain(|&l| l != lsn);
        }
        if st.fail_at == Some(lsn) {
            return Err(DeviceError::new(Injected));
        }
        st.calls.push(Call::Write {
            lsn,
            len: bytes.len(),
            flags,
        });
        st.records.push((lsn, bytes.to_vec()));
        cv.notify_all();
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        let mut st = self.state.0.lock();
        if std::mem::take(&mut st.fail_flush) {
            return Err(DeviceError::new(Injected));
        }
        st.calls.push(Call::Flush);
        Ok(())
    }
}
