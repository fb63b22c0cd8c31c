//! Rule-driven decisions through the exported v1, v2, v4, v5 and v6 tables, called
//! through their raw function pointers exactly as NCCL calls them: a flat float[7][3]
//! cost table cast to `float**` with canary floats around it, an nChannels int with
//! canaries, and for v5/v6 a 1152-byte constants struct with canaries. Expectations
//! follow NCCL's example tuner's CSV semantics (the first matching line whose entry
//! is supported wins; -1 keeps NCCL's value) and the TOML format in the README; where
//! the model decides, see `abi_decisions.rs` for its hand-computed tables.

mod common;

use std::ffi::c_void;
use std::ptr;

use cclkit_abi::raw::common::{Func, NcclResult};
use cclkit_abi::tuner::CollInfo;
use cclkit_tuner::model::{LinkParams, Model};
use cclkit_tuner::{ncclTunerPlugin_v1, ncclTunerPlugin_v2, ncclTunerPlugin_v6};
use common::comm::{Comm, Ver};
use common::{Channels, Env, NA, NP, Table, capture_logs};

const RULES: &str = "\
# NCCL example format
allreduce,0,65535,tree,ll,4,-1,-1
allreduce,65536,1048575,ring,ll128,-1,2,-1
allreduce,65536,1048575,ring,simple,8,-1,-1
allgather,0,-1,pat,simple,2,-1,-1
allgather,0,-1,ring,ll,-1,-1,-1
broadcast,0,-1,tree,simple,-1,-1,-1,-1,1
reduce,0,-1,tree,ll128,3,-1,-1,2
";

const VERSIONS: [Ver; 3] = [Ver::V4, Ver::V5, Ver::V6];

#[test]
fn csv_rules_through_v4_v5_v6() {
    let mut env = Env::lock();
    env.config(RULES, "conf");
    env.set("CCLKIT_TUNER_MODE", "rules");
    for ver in VERSIONS {
        let comm = Comm::open(ver, 16, 2);

        // First rule: tree/LL selected (0.0), channels 4, nothing else touched.
        let mut t = Table::typical();
        let before = t.costs();
        assert_eq!(comm.coll(Func::ALL_REDUCE, 4096, 1, 0, &mut t), 4);
        let mut want = before;
        want[0][0] = 0.0;
        assert_eq!(t.costs(), want, "{ver:?}");

        // Boundary sizes are inclusive.
        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::ALL_REDUCE, 65535, 1, 0, &mut t), 4);
        assert_eq!(t.nccl_choice(), Some((0, 0)));

        // 2-node rule: ring/LL128, channels -1 keeps NCCL's (0).
        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::ALL_REDUCE, 65536, 1, 0, &mut t), 0);
        assert_eq!(t.get(1, 1), 0.0);
        assert_eq!(t.nccl_choice(), Some((1, 1)));

        // The selected entry unsupported: the next matching rule is tried (NCCL's
        // example does the same), and the skipped rule's channels are not applied.
        let t = Table::typical();
        assert_eq!(t.get(6, 2), 45.0);
        let mut c = t.costs();
        c[6][2] = -1.0;
        let mut t = Table::new(c);
        assert_eq!(comm.coll(Func::ALL_GATHER, 1 << 20, 1, 0, &mut t), 0);
        assert_eq!(t.nccl_choice(), Some((1, 0)));

        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::ALL_GATHER, 1 << 20, 1, 0, &mut t), 2);
        assert_eq!(t.nccl_choice(), Some((6, 2)));

        // regBuff and numPipeOps conditions.
        let mut t = Table::typical();
        let before = t.costs();
        assert_eq!(comm.coll(Func::BROADCAST, 100, 1, 0, &mut t), 0);
        assert_eq!(t.costs(), before, "regBuff=0 must not match");
        assert_eq!(comm.coll(Func::BROADCAST, 100, 1, 1, &mut t), 0);
        assert_eq!(t.nccl_choice(), Some((0, 2)));
        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::REDUCE, 100, 1, 0, &mut t), 0);
        assert_eq!(t.costs(), before);
        assert_eq!(comm.coll(Func::REDUCE, 100, 2, 0, &mut t), 3);
        assert_eq!(t.nccl_choice(), Some((0, 1)));

        // Unmatched (reducescatter has no rule): in rules mode the table and
        // nChannels are left alone — NCCL's example would force nChannels = 1.
        let mut t = Table::typical();
        let before = t.costs();
        assert_eq!(comm.coll(Func::REDUCE_SCATTER, 4096, 1, 0, &mut t), 0);
        assert_eq!(t.costs(), before);
    }
}

#[test]
fn comm_shape_conditions_per_communicator() {
    let mut env = Env::lock();
    env.config(RULES, "conf");
    env.set("CCLKIT_TUNER_MODE", "rules");
    for ver in VERSIONS {
        let two = Comm::open(ver, 16, 2);
        let four = Comm::open(ver, 32, 4);
        assert_ne!(two.ctx, four.ctx);
        let mut t = Table::typical();
        assert_eq!(two.coll(Func::ALL_REDUCE, 100_000, 1, 0, &mut t), 0);
        assert_eq!(t.nccl_choice(), Some((1, 1)));
        let mut t = Table::typical();
        assert_eq!(four.coll(Func::ALL_REDUCE, 100_000, 1, 0, &mut t), 8);
        assert_eq!(t.nccl_choice(), Some((1, 2)));
    }
}

#[test]
fn missing_explicit_file_and_bad_variables_warn_but_init_succeeds() {
    let mut env = Env::lock();
    env.set("NCCL_TUNER_CONFIG_FILE", "/nonexistent/cclkit/tuner.conf");
    env.set("CCLKIT_TUNER_NET_BW", "fast");
    env.set("CCLKIT_TUNER_FROBNICATE", "1");
    env.set("CCLKIT_TUNER_MODE", "sometimes");
    let (comm, logs) = capture_logs(|| Comm::open(Ver::V6, 8, 1));
    assert!(
        logs.contains(
            "NCCL_TUNER_CONFIG_FILE=/nonexistent/cclkit/tuner.conf: no such file; the model decides"
        ),
        "{logs}"
    );
    assert!(
        logs.contains("CCLKIT_TUNER_NET_BW: \"fast\" is not a number"),
        "{logs}"
    );
    assert!(
        logs.contains("CCLKIT_TUNER_FROBNICATE: unknown variable, ignored"),
        "{logs}"
    );
    assert!(
        logs.contains(
            "CCLKIT_TUNER_MODE: unknown mode \"sometimes\" (expected rules, model or auto)"
        ),
        "{logs}"
    );
    let mut t = Table::typical();
    comm.coll(Func::ALL_REDUCE, 1 << 20, 1, 0, &mut t);
    assert_ne!(t.costs(), Table::typical().costs());
}

#[test]
fn default_file_in_working_directory() {
    let env = Env::lock();
    let dir = std::env::temp_dir().join(format!("cclkit-tuner-cwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("nccl_tuner.conf"),
        "allreduce,0,-1,ring,ll128,6,-1,-1\n",
    )
    .unwrap();
    let old = std::env::current_dir().unwrap();
    std::env::set_current_dir(&dir).unwrap();
    let comm = Comm::open(Ver::V6, 8, 1);
    std::env::set_current_dir(&old).unwrap();
    let mut t = Table::typical();
    assert_eq!(comm.coll(Func::ALL_REDUCE, 1 << 20, 1, 0, &mut t), 6);
    assert_eq!(t.nccl_choice(), Some((1, 1)));
    drop(comm);
    drop(env);
    std::fs::remove_dir_all(&dir).unwrap();
}

const TOML_RULES: &str = r#"
[[rule]]
collective = ["allreduce", "allgather"]
size = "..64K"
protocol = "ll"

[[rule]]
collective = "allreduce"
size = "64K..16M"
algorithm = "ring"
protocol = "simple"
chunk_size = "256K"

[[rule]]
collective = "allreduce"
size = "16M.."
channels = 24

[[rule]]
collective = "broadcast"
chunk_size = "1M"

[defaults.reduce]
algorithm = "tree"
protocol = "simple"
channels = 2
"#;

#[test]
fn toml_rules_partial_actions_and_chunk_size_v6() {
    let mut env = Env::lock();
    env.config(TOML_RULES, "toml");
    let comm = Comm::open(Ver::V6, 16, 2);
    // Protocol-only rule: the cheapest supported LL entry (ring LL at 30 < tree LL at 40
    // before the model ranks them; the model then decides between them).
    // By hand (abi_decisions.rs): ring LL 17.7 + 1024·(15/16)/25 000 ≈ 17.74 µs, the only
    // modelled LL entry for allgather; tree LL keeps NCCL's 40.
    let mut t = Table::typical();
    assert_eq!(comm.coll(Func::ALL_GATHER, 1024, 1, 0, &mut t), 0);
    assert_eq!(t.nccl_choice(), Some((1, 0)));
    let mut c = Table::typical().costs();
    c[0][0] = -1.0;
    let mut t = Table::new(c);
    comm.coll(Func::ALL_REDUCE, 1024, 1, 0, &mut t);
    assert_eq!(t.nccl_choice(), Some((1, 0)));
    // Channels-only rule: channels set, the model picks the entry. By hand (the
    // allreduce table in abi_decisions.rs), 64 MiB: ring Simple 131.6 + 2^26·1.875/100 000
    // = 1389.9 µs beats ring LL128 1442.9, tree LL128 1480.2 and tree Simple 1551.3.
    let mut t = Table::typical();
    assert_eq!(comm.coll(Func::ALL_REDUCE, 1 << 26, 1, 0, &mut t), 24);
    assert_eq!(t.nccl_choice(), Some((1, 2)));
    // Per-collective default.
    let mut t = Table::typical();
    assert_eq!(comm.coll(Func::REDUCE, 12345, 1, 0, &mut t), 2);
    assert_eq!(t.nccl_choice(), Some((0, 2)));

    // getChunkSize: the rule's algorithm/protocol must be NCCL's choice.
    let chunk = ncclTunerPlugin_v6.getChunkSize.unwrap();
    let call = |func: Func, n: usize, a: i32, p: i32| {
        let mut buf = [7usize, 131072, 7usize];
        // SAFETY: live context; writable chunk size between canaries.
        let rc = unsafe { chunk(comm.ctx, func, n, a, p, 8, &mut buf[1]) };
        assert_eq!(rc, NcclResult::SUCCESS);
        assert_eq!((buf[0], buf[2]), (7, 7));
        buf[1]
    };
    assert_eq!(call(Func::ALL_REDUCE, 1 << 20, 1, 2), 256 << 10);
    assert_eq!(call(Func::ALL_REDUCE, 1 << 20, 0, 2), 131072);
    assert_eq!(call(Func::ALL_REDUCE, 1 << 30, 1, 2), 131072);
    assert_eq!(call(Func::BROADCAST, 5, 0, 0), 1 << 20);
    assert_eq!(call(Func::ALL_GATHER, 5, 1, 0), 131072);
}

#[test]
fn v2_returns_algorithm_and_protocol() {
    let mut env = Env::lock();
    env.config(
        "allreduce,0,1023,tree,ll,4,-1,-1\n\
         allreduce,1024,4095,collnet_direct,simple,-1,-1,-1\n\
         allreduce,1024,4095,ring,ll128,-1,-1,-1\n",
        "conf",
    );
    env.set("CCLKIT_TUNER_MODE", "rules");
    let t = &ncclTunerPlugin_v2;
    let mut ctx: *mut c_void = ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { t.init.unwrap()(16, 2, None, &mut ctx) };
    assert_eq!(rc, NcclResult::SUCCESS);
    let call = |ctx: *mut c_void, n: usize, coll_net: i32| {
        let (mut a, mut p) = (-1, -1);
        let mut ch = Channels::new();
        // SAFETY: live context, writable outputs.
        let rc = unsafe {
            t.getCollInfo.unwrap()(
                ctx,
                Func::ALL_REDUCE,
                n,
                coll_net,
                0,
                1,
                &mut a,
                &mut p,
                ch.ptr(),
            )
        };
        assert_eq!(rc, NcclResult::SUCCESS);
        (a, p, ch.get())
    };
    assert_eq!(call(ctx, 100, 0), (0, 0, 4));
    assert_eq!(call(ctx, 2000, 1), (2, 2, 0));
    assert_eq!(call(ctx, 2000, 0), (1, 1, 0));
    // No rule: NCCL's own choice stands (outputs untouched).
    assert_eq!(call(ctx, 1 << 20, 0), (-1, -1, 0));
    // SAFETY: context from init.
    assert_eq!(unsafe { t.destroy.unwrap()(ctx) }, NcclResult::SUCCESS);
}

#[test]
fn v1_global_instance() {
    let mut env = Env::lock();
    env.config("allgather,0,-1,ring,ll,-1,-1,-1\n", "conf");
    let t = &ncclTunerPlugin_v1;
    // SAFETY: plain values.
    assert_eq!(unsafe { t.init.unwrap()(8, 1, None) }, NcclResult::SUCCESS);
    let (mut a, mut p) = (-1, -1);
    let mut ch = Channels::new();
    // SAFETY: writable outputs.
    let rc = unsafe {
        t.getCollInfo.unwrap()(Func::ALL_GATHER, 4096, 0, 0, 1, &mut a, &mut p, ch.ptr())
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    assert_eq!((a, p, ch.get()), (1, 0, 0));
    // SAFETY: after init.
    assert_eq!(unsafe { t.destroy.unwrap()() }, NcclResult::SUCCESS);
}

#[test]
fn engine_reports_decisions() {
    use cclkit_abi::tuner::CostTable;
    use cclkit_tuner::config::{self, Format};
    use cclkit_tuner::engine::{Decision, Engine, Mode};
    let p = config::parse(RULES, "r.conf", Format::Csv);
    let m = Model::new(16, 2, &LinkParams::default(), None);
    let e = Engine::new(&p.rules, 16, 2, Mode::Auto, Some(m));
    assert_eq!(e.rule_count(), 7);
    let mut costs = Table::typical().costs().concat();
    let mut table = CostTable::new(&mut costs, NA, NP).unwrap();
    let mut ch = 0;
    let info = |func, n| CollInfo {
        func,
        n_bytes: n,
        num_pipe_ops: 1,
        reg_buff: Some(false),
    };
    assert_eq!(
        e.decide(&info(Func::ALL_REDUCE, 10), &mut table, &mut ch),
        Decision::Rule { line: 2 }
    );
    let mut costs = Table::typical().costs().concat();
    let mut table = CostTable::new(&mut costs, NA, NP).unwrap();
    assert_eq!(
        e.decide(&info(Func::REDUCE_SCATTER, 10), &mut table, &mut ch),
        Decision::Model
    );
    let stats: Vec<_> = e
        .rule_stats()
        .map(|s| (s.line, s.matched, s.taken))
        .collect();
    assert_eq!(stats[0], (2, 1, 1));
    let r = Engine::new(&p.rules, 16, 2, Mode::Rules, None);
    let mut costs = Table::typical().costs().concat();
    let mut table = CostTable::new(&mut costs, NA, NP).unwrap();
    assert_eq!(
        r.decide(&info(Func::REDUCE_SCATTER, 10), &mut table, &mut ch),
        Decision::Unchanged
    );
    assert_eq!(r.fallback_stats(), (0, 1));
}

#[test]
fn finalize_reports_what_decided_and_what_was_not_honoured() {
    let mut env = Env::lock();
    env.config(RULES, "conf");
    let comm = Comm::open(Ver::V6, 16, 2);
    let mut t = Table::typical();
    comm.coll(Func::ALL_REDUCE, 100, 1, 0, &mut t);
    // tree/LL unsupported: rule 1 matches but cannot be taken; the model decides.
    let mut c = Table::typical().costs();
    c[0][0] = -1.0;
    let mut t = Table::new(c);
    comm.coll(Func::ALL_REDUCE, 100, 1, 0, &mut t);
    let mut t = Table::typical();
    comm.coll(Func::REDUCE_SCATTER, 100, 1, 0, &mut t);
    let ((), logs) = capture_logs(|| drop(comm));
    assert!(
        logs.contains(
            "cclkit tuner (comm 0x0000000000c0ffee): 1 calls decided by rules, 2 by the model, \
             0 left to NCCL; line 2: 2 matched, 1 taken (entry unsupported 1 times)"
        ),
        "{logs}"
    );
}
