//! `cclkit tune auto --verify FILE`: run the sweep with a tuner plugin (default: the
//! packaged cclkit tuner) reading `FILE` through `NCCL_TUNER_CONFIG_FILE`, and check
//! that every collective ran with what the file says: the first rule whose
//! conditions hold and whose algorithm/protocol the runtime offers for the call (as
//! NVIDIA's example and cclkit's tuner take rules), channels clamped to the
//! communicator's. Calls no rule takes are listed but not checked.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cclkit_abi::raw::common::{Func, NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_PROTOCOLS};
use cclkit_tuner::config::{Query, Rule, RuleSet, format_size, names};

use super::auto::{AutoArgs, sweep_sizes};
use super::eval::read_rules;
use super::ranks::{Buffers, Joined, join};
use super::{coll_name, fail, packaged_tuner, set_tuner_config_file};
use cclkit_host::LoaderConfig;
use cclkit_host::select::TunerRegistry;
use cclkit_host::tuner::CostTable;
use cclkit_runtime::tune::{Decision, Source, idx};
use cclkit_runtime::{Comm, Config};

/// What a rule says about one call.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Expected {
    line: u32,
    rule: usize,
    algo: Option<cclkit_abi::raw::common::Algorithm>,
    proto: Option<cclkit_abi::raw::common::Protocol>,
    channels: Option<usize>,
}

/// Runs the check.
pub(crate) fn run(a: &AutoArgs, file: &Path) -> ExitCode {
    let parsed = match read_rules(file) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let file = match std::path::absolute(file) {
        Ok(f) => f,
        Err(e) => return fail(format!("{}: {e}", file.display())),
    };
    // Before any rank or thread exists; spawned ranks inherit it.
    set_tuner_config_file(&file);
    let tuner = a.tuner.clone().unwrap_or_else(packaged_tuner);
    let mut config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let timeout = match Duration::try_from_secs_f64(a.timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => return fail(format!("--timeout {} is not a positive number", a.timeout)),
    };
    config.bootstrap_timeout = timeout;
    config.tuner_registry = Some(Arc::new(TunerRegistry::new(LoaderConfig {
        tuner_plugin: Some(tuner.clone()),
        ..LoaderConfig::from_env()
    })));
    let comm = match join(a.np, &config, timeout) {
        Ok(Joined::Launched(code)) => return code,
        Ok(Joined::Rank(c)) => c,
        Err(e) => return fail(e),
    };
    let comm = *comm;
    let rank = comm.rank();
    let outcome = check(a, &comm, &parsed.rules, &file, &tuner);
    let destroyed = comm.destroy();
    match (outcome, destroyed) {
        (Ok(0), Ok(())) => ExitCode::SUCCESS,
        // Only rank 0 counts mismatches; it has printed them.
        (Ok(_), Ok(())) => ExitCode::from(1),
        (Err(e), _) => fail(format!("rank {rank}: {e}")),
        (Ok(_), Err(e)) => fail(format!("rank {rank}: destroy: {e}")),
    }
}

/// Runs every point, returns the number of mismatches (on rank 0; 0 elsewhere); 1
/// when no rule applied at all.
fn check(
    a: &AutoArgs,
    comm: &Comm,
    rules: &RuleSet,
    file: &Path,
    tuner: &str,
) -> Result<usize, String> {
    let Some(used) = comm.tuning().tuner_name() else {
        return Err(format!(
            "the tuner '{tuner}' was not loaded (the warnings above say why; build it with \
             `make package` or pass --tuner)"
        ));
    };
    let n = comm.nranks();
    let nodes = comm.ring().hosts;
    let sizes = sweep_sizes(&a.sweep, n)?;
    let colls = a.sweep.colls_or(rule_colls(rules));
    let mut bufs = Buffers::new(sizes.iter().copied().max().unwrap_or(0))?;
    let mut lines = Vec::new();
    let mut bad = 0;
    for &func in &colls {
        for &size in &sizes {
            let d = bufs.run(comm, func, size)?;
            // Which entries the runtime offers does not depend on the channel count.
            let table = comm.tuning().table(func, size as usize, comm.channels());
            let q = Query {
                func,
                n_bytes: size,
                n_nodes: nodes as u64,
                n_ranks: n as u64,
                num_pipe_ops: 1,
                reg_buff: Some(false),
            };
            let (want, skipped) = expected(rules, &q, &table, comm.channels());
            let ok = want.is_none_or(|w| honoured(&w, &d));
            bad += usize::from(!ok);
            lines.push(line(func, size, want.as_ref(), skipped, &d, ok));
        }
    }
    if comm.rank() != 0 {
        return Ok(0);
    }
    println!(
        "# verify {}: tuner {used}; {n} rank(s) on {nodes} node(s), {} channel(s)",
        file.display(),
        comm.channels()
    );
    println!(
        "# {:<13} {:>8}  {:<8} {:<18} {:<18} {:<8} status",
        "collective", "size", "rule", "expected", "ran", "source"
    );
    for l in &lines {
        println!("{l}");
    }
    let checked = lines.iter().filter(|l| !l.contains(" no rule")).count();
    if checked == 0 {
        // A file measured on another communicator shape (auto writes nNodes/nRanks)
        // verifies nothing here: say so rather than pass.
        println!(
            "# nothing checked: no rule of the file holds for {n} rank(s) on {nodes} node(s) \
             at these sizes"
        );
        return Ok(1);
    }
    if bad == 0 {
        println!("# every decision followed the rules ({checked} checked)");
    } else {
        println!("# {bad} of {checked} decision(s) did not follow the rules");
    }
    Ok(bad)
}

/// The collectives the rules act on, in NCCL order.
fn rule_colls(rules: &RuleSet) -> Vec<Func> {
    super::all_colls()
        .into_iter()
        .filter(|f| {
            rules
                .rules
                .iter()
                .any(|r| r.acts_on_coll_info() && r.collectives.contains(*f))
        })
        .collect()
}

/// The first rule that holds and whose choice the runtime offers for this call, and
/// the line of the first rule skipped before it because its choice is not offered.
fn expected(
    rules: &RuleSet,
    q: &Query,
    table: &CostTable,
    max_ch: usize,
) -> (Option<Expected>, Option<u32>) {
    let offered = |r: &Rule| {
        let any = |keep: &dyn Fn(usize) -> bool| {
            (0..table.len()).any(|i| keep(i) && table[i] != NCCL_ALGO_PROTO_IGNORE)
        };
        match (r.algorithm, r.protocol) {
            (Some(a), Some(p)) => table
                .get(idx(a, p))
                .is_some_and(|c| *c != NCCL_ALGO_PROTO_IGNORE),
            (Some(a), None) => any(&|i| i / NCCL_NUM_PROTOCOLS == a.0 as usize),
            (None, Some(p)) => any(&|i| i % NCCL_NUM_PROTOCOLS == p.0 as usize),
            (None, None) => true,
        }
    };
    let holds = |r: &&Rule| r.acts_on_coll_info() && r.matches(q);
    let taken = rules
        .rules
        .iter()
        .enumerate()
        .find(|(_, r)| holds(r) && offered(r));
    let skipped = rules
        .rules
        .iter()
        .take(taken.map_or(rules.rules.len(), |(i, _)| i))
        .find(|r| holds(r))
        .map(|r| r.line);
    let want = taken.map(|(i, r)| Expected {
        line: r.line,
        rule: i,
        algo: r.algorithm,
        proto: r.protocol,
        channels: r.channels.map(|c| (c as usize).min(max_ch)),
    });
    (want, skipped)
}

fn honoured(w: &Expected, d: &Decision) -> bool {
    d.source != Source::Fallback
        && w.algo.is_none_or(|a| a == d.algo)
        && w.proto.is_none_or(|p| p == d.proto)
        && w.channels.is_none_or(|c| c == d.channels)
}

fn line(
    func: Func,
    size: u64,
    want: Option<&Expected>,
    skipped: Option<u32>,
    d: &Decision,
    ok: bool,
) -> String {
    let ran = format!(
        "{}/{}/{}",
        names::algorithm_name(d.algo),
        names::protocol_name(d.proto),
        d.channels
    );
    let (rule, exp) = want.map_or(("-".to_owned(), "-".to_owned()), |w| {
        (
            if w.line > 0 {
                format!("line {}", w.line)
            } else {
                format!("#{}", w.rule + 1)
            },
            format!(
                "{}/{}/{}",
                w.algo.map_or("*", names::algorithm_name),
                w.proto.map_or("*", names::protocol_name),
                w.channels.map_or_else(|| "*".to_owned(), |c| c.to_string())
            ),
        )
    });
    let status = match (want, ok) {
        (None, _) => "no rule".to_owned(),
        (Some(_), true) => "ok".to_owned(),
        (Some(_), false) => "MISMATCH".to_owned(),
    };
    let status = match skipped {
        Some(l) => format!("{status} (line {l} skipped: its choice is not offered here)"),
        None => status,
    };
    format!(
        "  {:<13} {:>8}  {:<8} {:<18} {:<18} {:<8} {status}",
        coll_name(func),
        format_size(size),
        rule,
        exp,
        ran,
        format!("{:?}", d.source).to_lowercase(),
    )
}
