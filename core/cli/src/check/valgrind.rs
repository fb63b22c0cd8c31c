//! The tuner leak check under valgrind: the parent wraps that one child in
//! `valgrind --leak-check=full` and reads the log afterwards.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::report::{CheckResult, Status};

/// A valgrind run: the executable and the log it writes (removed on drop).
pub(crate) struct Valgrind {
    exe: PathBuf,
    log: PathBuf,
}

impl Valgrind {
    /// `valgrind` from `PATH`, unless `CCLKIT_CHECK_NO_VALGRIND` is set.
    pub fn find() -> Option<Self> {
        if std::env::var_os("CCLKIT_CHECK_NO_VALGRIND").is_some() {
            return None;
        }
        let exe = std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("valgrind"))
                .find(|f| f.is_file())
        })?;
        Some(Self {
            exe,
            log: fresh_log(),
        })
    }

    /// `valgrind … program`; the child learns it runs under valgrind from
    /// `CCLKIT_CHECK_UNDER_VALGRIND` (it then runs fewer cycles).
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(&self.exe);
        c.args([
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--show-leak-kinds=definite",
            "--num-callers=12",
        ])
        .arg(format!("--log-file={}", self.log.display()))
        .arg(program)
        .env("CCLKIT_CHECK_UNDER_VALGRIND", "1");
        c
    }

    /// Adds valgrind's verdict to a passing result.
    pub fn judge(&self, result: &mut CheckResult) {
        if result.status != Status::Pass {
            return;
        }
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        match read_leaks(&text) {
            Ok(note) => result.message.push_str(&note),
            Err(leak) => {
                result.status = Status::Fail;
                result.message = leak;
            }
        }
    }
}

impl Drop for Valgrind {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A fresh log path in the temporary directory.
fn fresh_log() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "cclkit-check-valgrind-{}-{n}.log",
        std::process::id()
    ))
}

/// Reads a valgrind log of the tuner `finalize` check: a loss record with at least
/// as many blocks as init/finalize cycles is a per-cycle leak (`Err`, a failure
/// message); smaller records are one-time allocations (`Ok`, a note).
fn read_leaks(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Ok("; valgrind wrote no log".into());
    }
    // "==pid== N bytes in M blocks are definitely lost in loss record …", then the
    // stack ("==pid==    at …" / "by …") up to an empty "==pid==" line.
    let bodies: Vec<&str> = text
        .lines()
        .map(|l| l.split_once("== ").map_or("", |(_, b)| b).trim())
        .collect();
    let mut once = Vec::new();
    for (at, b) in bodies.iter().enumerate() {
        let Some((head, _)) = b.split_once(" are definitely lost") else {
            continue;
        };
        let blocks: usize = head
            .split_whitespace()
            .rev()
            .nth(1)
            .and_then(|n| n.replace(',', "").parse().ok())
            .unwrap_or(0);
        let frames: Vec<&str> = bodies[at + 1..]
            .iter()
            .take_while(|f| !f.is_empty())
            .filter(|f| {
                !["vgpreload", "library/alloc", "library/std", "library/core"]
                    .iter()
                    .any(|skip| f.contains(skip))
            })
            .take(3)
            .copied()
            .collect();
        let what = format!("{head}, allocated at {}", frames.join(" <- "));
        if blocks >= super::tuner::VALGRIND_CYCLES {
            return Err(format!(
                "finalize does not free what init allocated: valgrind, after {} init/finalize \
                 cycles: {what}",
                super::tuner::VALGRIND_CYCLES
            ));
        }
        once.push(what);
    }
    Ok(if once.is_empty() {
        "; valgrind: no definite leaks".into()
    } else {
        format!(
            "; valgrind: no per-cycle leak ({} one-time: {})",
            once.len(),
            once.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "==1== Memcheck, a memory error detector
==1== 
==1== 16 bytes in 1 blocks are definitely lost in loss record 26 of 40
==1==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==1==    by 0x51A00D0: alloc (library/alloc/src/alloc.rs:95)
==1==    by 0x519FC2F: cclkit_abi::export::guard::install_hook (guard.rs:28)
==1== 
==1== 640 bytes in 20 blocks are definitely lost in loss record 30 of 40
==1==    at 0x48465EF: calloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==1==    by 0x51421FD: init_v5 (in /tmp/ctuner-leak.so)
==1==    by 0x62723E: cclkit::plugin::tuner::context::v5_init (context.rs:315)
==1== 
";

    #[test]
    fn one_block_per_cycle_is_a_leak_and_one_time_blocks_are_a_note() {
        let leak = read_leaks(LOG).unwrap_err();
        assert!(leak.contains("640 bytes in 20 blocks"), "{leak}");
        assert!(
            leak.contains("by 0x51421FD: init_v5 (in /tmp/ctuner-leak.so)"),
            "{leak}"
        );
        assert!(!leak.contains("vgpreload"), "{leak}");
        let once: String = LOG.lines().take(7).map(|l| format!("{l}\n")).collect();
        let note = read_leaks(&once).expect("a one-time leak is not a failure");
        assert!(
            note.contains("no per-cycle leak (1 one-time: 16 bytes in 1 blocks"),
            "{note}"
        );
        assert_eq!(
            read_leaks("==1== All heap blocks were freed\n").as_deref(),
            Ok("; valgrind: no definite leaks")
        );
    }
}
