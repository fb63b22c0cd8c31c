//! `getCollInfo` cost with a 50-rule table, called through the exported v6 table's
//! raw function pointer exactly as NCCL calls it (flat float[7][3] cast to float**).
//!
//! Each iteration restores the 21-entry table from a template (a 84-byte copy) and
//! makes one call; queries cycle through collectives and sizes so some hit rules,
//! some fall to the model.
//!
//! `cargo bench -p cclkit-tuner --bench get_coll_info`

use std::ffi::c_void;
use std::hint::black_box;

use cclkit_abi::raw::common::{Func, NcclResult};
use cclkit_abi::raw::tuner::ncclTunerConstants_v5_t;
use criterion::{Criterion, criterion_group, criterion_main};

/// 50 rules: 5 collectives × 10 size bands, half of them tied to 2 nodes.
fn rules_csv() -> String {
    let mut s = String::from("# 50-rule benchmark table\n");
    let algos = ["tree", "ring"];
    let protos = ["ll", "ll128", "simple"];
    for (ci, coll) in [
        "broadcast",
        "reduce",
        "allgather",
        "reducescatter",
        "allreduce",
    ]
    .iter()
    .enumerate()
    {
        for band in 0..10u64 {
            let lo = if band == 0 { 0 } else { 1u64 << (8 + 2 * band) };
            let hi = (1u64 << (10 + 2 * band)) - 1;
            let nodes = if band % 2 == 0 { "2" } else { "-1" };
            s.push_str(&format!(
                "{coll},{lo},{hi},{},{},{},{nodes},-1\n",
                algos[(band as usize + ci) % 2],
                protos[band as usize % 3],
                if band % 3 == 0 { 8 } else { -1 }
            ));
        }
    }
    s
}

fn bench(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("cclkit-tuner-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.conf");
    std::fs::write(&file, rules_csv()).unwrap();
    // SAFETY: single-threaded at this point; nothing else reads the environment.
    unsafe { std::env::set_var("NCCL_TUNER_CONFIG_FILE", &file) };

    let t = &cclkit_tuner::ncclTunerPlugin_v6;
    let init = t.init.unwrap();
    let get = t.getCollInfo.unwrap();
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let mut constants = cclkit_abi::tuner::NCCL_DEFAULT_CONSTANTS;
    let mut nvl = Default::default();
    // SAFETY: valid out-pointer, NVL info and constants for the call.
    let rc = unsafe {
        init(
            &mut ctx,
            0x5eed,
            16,
            2,
            None,
            &mut nvl,
            &mut constants as *mut ncclTunerConstants_v5_t,
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);

    let template: [f32; 21] =
        std::array::from_fn(|i| if i / 3 < 2 { 50.0 + i as f32 } else { -1.0 });
    let queries: Vec<(Func, usize)> = (0..64)
        .map(|i| (Func(i % 5), 1usize << (4 + (i * 7) % 28)))
        .collect();

    let mut group = c.benchmark_group("getCollInfo");
    group.bench_function("v6 fn pointer, 50 rules", |b| {
        let mut k = 0usize;
        let mut table = template;
        b.iter(|| {
            let (func, n) = queries[k % queries.len()];
            k += 1;
            table = template;
            let mut nch = 0;
            // SAFETY: live context, 7×3 table, writable nChannels.
            let rc = unsafe {
                get(
                    ctx,
                    func,
                    n,
                    1,
                    table.as_mut_ptr().cast(),
                    7,
                    3,
                    0,
                    &mut nch,
                )
            };
            black_box((rc, nch, &table));
        })
    });
    group.bench_function("v6 fn pointer, model only (no rule file)", |b| {
        // SAFETY: removing the variable before the second init; still single-threaded.
        unsafe { std::env::set_var("CCLKIT_TUNER_MODE", "model") };
        let mut mctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: as above.
        let rc = unsafe { init(&mut mctx, 0x5eee, 16, 2, None, &mut nvl, &mut constants) };
        assert_eq!(rc, NcclResult::SUCCESS);
        let mut k = 0usize;
        let mut table = template;
        b.iter(|| {
            let (func, n) = queries[k % queries.len()];
            k += 1;
            table = template;
            let mut nch = 0;
            // SAFETY: live context, 7×3 table, writable nChannels.
            let rc = unsafe {
                get(
                    mctx,
                    func,
                    n,
                    1,
                    table.as_mut_ptr().cast(),
                    7,
                    3,
                    0,
                    &mut nch,
                )
            };
            black_box((rc, nch, &table));
        });
        // SAFETY: context from init, finalized once.
        unsafe { t.finalize.unwrap()(mctx) };
    });
    group.bench_function("Model::apply alone (no fn pointer, no guard)", |b| {
        use cclkit_abi::tuner::{CollInfo, CostTable};
        use cclkit_tuner::model::{LinkParams, Model};
        let m = Model::new(16, 2, &LinkParams::default(), Some(&constants));
        let mut k = 0usize;
        b.iter(|| {
            let (func, n) = queries[k % queries.len()];
            k += 1;
            let mut costs = template;
            let mut t = CostTable::new(&mut costs, 7, 3).unwrap();
            let info = CollInfo {
                func,
                n_bytes: n,
                num_pipe_ops: 1,
                reg_buff: Some(false),
            };
            black_box(m.apply(black_box(&info), &mut t));
            black_box(&costs);
        })
    });
    group.finish();
    // SAFETY: context from init, finalized once.
    unsafe { t.finalize.unwrap()(ctx) };
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
