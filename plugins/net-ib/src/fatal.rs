//! Fatal-state bookkeeping for asynchronous events, after NCCL's
//! `ncclIbAsyncThreadMain` and its fatal counters (`ncclIbDevFatalError`,
//! `ncclIbCqFatalError`, `ncclIbQpFatalError`, `ncclIbStatsCheckFatalCount`).
//!
//! An event thread (the verbs NIC's monitor, or the fake NIC's injector) records
//! events here; the data path checks the state on every `isend`/`irecv`/`test`, so a
//! device fatal error, a CQ error (overrun) or a QP fatal error becomes a clear error
//! within one call instead of a hang. Port errors and the other non-fatal events are
//! only logged, as in NCCL (a dead port shows up as completion errors once the QP's
//! retries run out: `NCCL_IB_TIMEOUT` × `NCCL_IB_RETRY_CNT`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cclkit_abi::{Error, Result, nccl_warn};

/// What NCCL does with an async event (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventClass {
    /// `IBV_EVENT_DEVICE_FATAL`: every comm on the device fails.
    DeviceFatal,
    /// `IBV_EVENT_CQ_ERR` (e.g. CQ overrun): comms on that CQ fail.
    CqFatal,
    /// `IBV_EVENT_QP_FATAL` / `QP_REQ_ERR` / `QP_ACCESS_ERR`: the QP's comm fails.
    QpFatal,
    /// Port error, port active, LID/PKey/GID change, …: logged only.
    NonFatal,
    /// `IBV_EVENT_COMM_EST`: silently ignored.
    Ignored,
}

/// NCCL's classification of `event_type` (raw `enum ibv_event_type`).
pub fn classify(event_type: u32) -> EventClass {
    match event_type {
        8 => EventClass::DeviceFatal,
        0 => EventClass::CqFatal,
        1..=3 => EventClass::QpFatal,
        4 => EventClass::Ignored,
        _ => EventClass::NonFatal,
    }
}

/// `ibv_event_type_str` without calling the library.
pub fn event_name(event_type: u32) -> &'static str {
    const NAMES: [&str; 20] = [
        "CQ error",
        "local work queue catastrophic error",
        "invalid request local work queue error",
        "local access violation work queue error",
        "communication established",
        "send queue drained",
        "path migrated",
        "path migration request error",
        "local catastrophic error",
        "port active",
        "port error",
        "LID change",
        "P_Key change",
        "SM change",
        "SRQ catastrophic error",
        "SRQ limit reached",
        "last WQE reached",
        "client reregistration",
        "GID table change",
        "WQ fatal",
    ];
    NAMES
        .get(event_type as usize)
        .copied()
        .unwrap_or("unknown event")
}

/// Fatal events seen on one device, keyed by the CQ they concern.
#[derive(Debug, Default)]
pub struct FatalState {
    /// `NCCL_IB_RETURN_ASYNC_EVENTS`: 0 keeps logging but never fails comms.
    enabled: AtomicBool,
    device: Mutex<Option<String>>,
    cqs: Mutex<HashMap<usize, String>>,
}

impl FatalState {
    /// A clean state; `enabled` = `NCCL_IB_RETURN_ASYNC_EVENTS`.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled: AtomicBool::new(enabled),
            ..Self::default()
        }
    }

    /// Records event `event_type` on device `dev` (`name:port`); `cq` identifies the
    /// CQ concerned (the CQ itself, or the send CQ of the QP concerned).
    pub fn record(&self, dev: &str, event_type: u32, cq: Option<usize>) {
        let what = event_name(event_type);
        match classify(event_type) {
            EventClass::DeviceFatal => {
                nccl_warn!("NET/cclkit-ib: {dev} async fatal event: {what}");
                let mut d = self.device.lock().unwrap_or_else(|p| p.into_inner());
                d.get_or_insert_with(|| format!("{dev} async fatal event: {what}"));
            }
            EventClass::CqFatal | EventClass::QpFatal => {
                nccl_warn!("NET/cclkit-ib: {dev} async fatal event on a CQ/QP: {what}");
                if let Some(cq) = cq {
                    let mut m = self.cqs.lock().unwrap_or_else(|p| p.into_inner());
                    m.entry(cq)
                        .or_insert_with(|| format!("{dev} async fatal event: {what}"));
                }
            }
            EventClass::NonFatal => {
                nccl_warn!("NET/cclkit-ib: {dev} got non-fatal async event: {what}({event_type})")
            }
            EventClass::Ignored => {}
        }
    }

    /// Forgets a destroyed CQ (its address may be reused).
    pub fn forget_cq(&self, cq: usize) {
        self.cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&cq);
    }

    /// `ncclIbStatsCheckFatalCount` for the device and CQ `cq`.
    pub fn check(&self, cq: usize) -> Result<()> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(());
        }
        let d = self.device.lock().unwrap_or_else(|p| p.into_inner());
        let c = self.cqs.lock().unwrap_or_else(|p| p.into_inner());
        match d.as_ref().or_else(|| c.get(&cq)) {
            Some(why) => Err(Error::system(format!(
                "NET/cclkit-ib: communicator encountered a fatal error: {why}"
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_matches_ncclibasyncthreadmain() {
        assert_eq!(classify(8), EventClass::DeviceFatal);
        assert_eq!(classify(0), EventClass::CqFatal);
        for qp in 1..=3 {
            assert_eq!(classify(qp), EventClass::QpFatal);
        }
        assert_eq!(
            classify(10),
            EventClass::NonFatal,
            "port error: logged only"
        );
        assert_eq!(classify(4), EventClass::Ignored);
        assert_eq!(event_name(8), "local catastrophic error");
    }

    #[test]
    fn fatal_events_fail_the_right_cqs_and_can_be_disabled() {
        let s = FatalState::new(true);
        s.record("mlx5_0:1", 10, None);
        assert!(s.check(1).is_ok(), "port error is not fatal");
        s.record("mlx5_0:1", 0, Some(7));
        assert!(s.check(1).is_ok());
        let e = s.check(7).unwrap_err();
        assert!(e.message().contains("CQ error"), "{}", e.message());
        s.forget_cq(7);
        assert!(s.check(7).is_ok());
        s.record("mlx5_0:1", 8, None);
        assert!(s.check(1).unwrap_err().message().contains("catastrophic"));
        let off = FatalState::new(false);
        off.record("mlx5_0:1", 8, None);
        assert!(off.check(1).is_ok(), "NCCL_IB_RETURN_ASYNC_EVENTS=0");
    }
}
