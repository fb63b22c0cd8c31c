//! Judging the receive sizes a plugin reports against what the schedule says was
//! sent (NCCL consumes the agreed size; a mismatch is a WARN, or an error under
//! `CCLKIT_STRICT=1`).

use super::RecvConn;
use crate::error::{Error, Result};
use crate::protocol::ProtoParams;

/// `CCLKIT_STRICT`, read once per process (the loader's rule: `1`, `true`, …).
pub(super) fn strict_from_env() -> bool {
    static STRICT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STRICT.get_or_init(|| cclkit_host::LoaderConfig::from_env().strict)
}

impl RecvConn {
    /// Judges the size the plugin's `test()` reported for a ready slot against the
    /// `wire` bytes the schedule says were sent into it.
    ///
    /// NCCL (2.30 `src/transport/net.cc`, receive proxy) uses reported sizes only for
    /// profiler events and to decide whether a GPU receive needs a flush; the data
    /// itself is consumed by the size both sides agreed on. Real plugins rely on that:
    /// a TCP plugin never writes the size, the UCX plugin reports the posted size. So
    /// a mismatch is a WARN once per connection, naming the plugin and the call, and
    /// the slice goes on with `wire` bytes (the data is still checked end to end);
    /// under `CCLKIT_STRICT=1` it is an error.
    pub fn reported_size(&mut self, p: &ProtoParams, got: usize, wire: usize) -> Result<()> {
        if got == wire || (self.size_warned && !self.strict) {
            return Ok(());
        }
        let (name, version) = self.comm.plugin();
        let posted = p.slot_wire();
        let what = format!(
            "{}: plugin '{name}' (net v{version}) test() reported {got} bytes received where \
             {wire} were expected (receive posted for {posted})",
            self.label
        );
        if self.strict {
            return Err(Error::invalid_usage(format!(
                "CCLKIT_STRICT=1: {what}; if the plugin reports sizes correctly, the ranks \
                 called different operations, counts or protocols"
            )));
        }
        self.size_warned = true;
        tracing::warn!(
            target: "cclkit::proxy",
            subsys = cclkit_abi::raw::common::subsys::NET,
            "{what}. NCCL uses this size only for profiler events and the GPU flush \
             decision, so cclkit goes on with the {wire} bytes expected and checks the data \
             end to end (#wrong); CCLKIT_STRICT=1 makes this an error. Reported once per \
             connection."
        );
        Ok(())
    }
}
