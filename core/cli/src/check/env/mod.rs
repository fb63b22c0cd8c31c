//! Env plugin checks (`ncclEnvPlugin_v1/_v2`, NCCL 2.28.7+; NCCL_ABI.md §3.4).
//!
//! NCCL 2.30.7 `dlsym`s `_v2`, then `_v1`, calls `init(major, minor, patch, suffix[,
//! logger])` once, then `getEnv(name)` for every `NCCL_*` it reads, from any thread,
//! and `finalize` at exit. A value must stay valid until the next `getEnv` of that
//! name. Contract checks call the table only that way; probes pass what NCCL never
//! does (NULL and very long names, a job variable the plugin does not know) and only
//! warn. Each check runs in its own child, so a crash or hang fails one check.

use std::collections::HashMap;

use super::child::{Env, step};
use super::rng::Rng;
use super::{CheckDef, Checked, Class, Family, Stop, fail};

mod table;

use table::{Answer, Table};

/// Every env check, in report order.
pub(crate) const CHECKS: &[CheckDef] = &[
    def(
        "table",
        Class::Contract,
        "NCCL prints the table's name and calls init and getEnv without a NULL check",
        "name, init and getEnv non-NULL (finalize may be NULL)",
        table_check,
    ),
    def(
        "init",
        Class::Contract,
        "NCCL calls init once with its version (v2: and its logger), finalize at exit",
        "init and finalize succeed",
        init_check,
    ),
    def(
        "get-env",
        Class::Contract,
        "NCCL calls getEnv for every NCCL_* it reads, set or not, from several threads",
        "answers are NULL or bounded strings, the same for the same name on every thread",
        get_env_check,
    ),
    def(
        "process-env",
        Class::Probe,
        "without a plugin NCCL reads the process environment (getenv)",
        "a variable set for the job reads back; an unset one reads NULL",
        process_env_check,
    ),
    def(
        "null-name",
        Class::Probe,
        "NCCL never passes a NULL name",
        "getEnv(NULL) returns without crashing",
        null_name_check,
    ),
    def(
        "long-name",
        Class::Probe,
        "NCCL's names are short NCCL_* identifiers",
        "a 64 KiB name is answered without crashing, with a bounded value",
        long_name_check,
    ),
];

const fn def(
    name: &'static str,
    class: Class,
    nccl: &'static str,
    about: &'static str,
    run: fn(&Env) -> Checked,
) -> CheckDef {
    CheckDef {
        name,
        family: Family::Env,
        class,
        about,
        nccl,
        run,
    }
}

/// The env versions a library exports, newest first.
pub(crate) fn exported(kinds: &[cclkit_host::kinds::Found]) -> Vec<u32> {
    kinds
        .iter()
        .filter(|f| f.kind == cclkit_host::kinds::Kind::Env)
        .map(|f| f.version)
        .collect()
}

/// Variables NCCL reads early, whichever plugin is loaded.
const NCCL_NAMES: [&str; 10] = [
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_BUFFSIZE",
    "NCCL_NET",
];

fn open(env: &Env) -> Result<Table, Stop> {
    step("dlopen and read the table");
    let lib = super::load::open(&env.library).map_err(Stop::Fail)?;
    Table::open(lib, env.version).map_err(Stop::Fail)
}

/// `open` plus a successful `init`.
fn started(env: &Env) -> Result<Table, Stop> {
    let t = open(env)?;
    step(format!("{}.init(2, 30, 7, \"\")", t.symbol));
    let mark = cclkit_host::logger::warn_mark();
    let rc = t.init().map_err(Stop::Fail)?;
    if !rc.is_ok() {
        return fail!(
            "init returned {rc}; NCCL then fails every communicator it creates{}",
            cclkit_host::logger::warn_since(mark)
                .map(|m| format!(" (plugin WARN: {m})"))
                .unwrap_or_default()
        );
    }
    Ok(t)
}

fn table_check(env: &Env) -> Checked {
    let t = open(env)?;
    let Some(name) = t.name() else {
        return fail!("{}.name is NULL (NCCL prints it when loading)", t.symbol);
    };
    let (init, get, fin) = t.slots();
    if !init || !get {
        return fail!(
            "{}.{} is NULL but NCCL calls it unconditionally",
            t.symbol,
            if init { "getEnv" } else { "init" }
        );
    }
    Ok(format!(
        "{} \"{name}\": init and getEnv present, finalize {}",
        t.symbol,
        if fin {
            "present"
        } else {
            "NULL (skipped, as NCCL does)"
        }
    ))
}

fn init_check(env: &Env) -> Checked {
    let t = started(env)?;
    step(format!("{}.finalize()", t.symbol));
    match t.finalize() {
        Some(rc) if !rc.is_ok() => fail!("finalize returned {rc}"),
        Some(_) => Ok("init(2, 30, 7) and finalize succeeded".into()),
        None => Ok("init(2, 30, 7) succeeded; finalize is NULL".into()),
    }
}

/// The names `get-env` asks: NCCL's plus random unset ones.
fn names(rng: &mut Rng) -> Vec<String> {
    let mut v: Vec<String> = NCCL_NAMES.iter().map(|s| (*s).to_owned()).collect();
    for _ in 0..6 {
        v.push(format!("NCCL_CCLKIT_CHECK_UNSET_{:X}", rng.next_u64()));
    }
    v
}

fn get_env_check(env: &Env) -> Checked {
    let t = started(env)?;
    let mut rng = Rng::new(env.seed, 0xe2f);
    let names = names(&mut rng);
    step("getEnv of NCCL's names and random unset ones");
    let mut first = HashMap::new();
    for n in &names {
        let a = t.get(n).map_err(Stop::Fail)?;
        if a == Answer::TooLong {
            return fail!("getEnv({n}) returned {}", a.show());
        }
        first.insert(n.clone(), a);
    }
    step("the same names again, in another order");
    for i in rng.permutation(names.len()) {
        let n = &names[i];
        let a = t.get(n).map_err(Stop::Fail)?;
        if first.get(n) != Some(&a) {
            return fail!(
                "getEnv({n}) answered {} then {}: NCCL reads some variables in more than one \
                 place (NCCL_NET_PLUGIN in the net and tuner loaders) and assumes one value",
                first.get(n).map_or_else(String::new, Answer::show),
                a.show()
            );
        }
    }
    step("4 threads asking every name 64 times at once");
    let bad = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|k| {
                let (t, names, first) = (&t, &names, &first);
                s.spawn(move || {
                    for round in 0..64 {
                        let n = &names[(round * 7 + k) % names.len()];
                        match t.get(n) {
                            Ok(a) if first.get(n) == Some(&a) => {}
                            Ok(a) => return Some(format!("getEnv({n}) answered {}", a.show())),
                            Err(e) => return Some(e),
                        }
                    }
                    None
                })
            })
            .collect();
        handles.into_iter().find_map(|h| {
            h.join()
                .unwrap_or_else(|_| Some("a thread panicked".into()))
        })
    });
    if let Some(b) = bad {
        return fail!("{b} on a concurrent call, not what it answered alone");
    }
    let set = first.values().filter(|a| **a != Answer::Unset).count();
    if let Some(rc) = t.finalize().filter(|rc| !rc.is_ok()) {
        return fail!("finalize after getEnv returned {rc}");
    }
    Ok(format!(
        "{} names ({set} set), stable across calls and 4 threads",
        names.len()
    ))
}

fn process_env_check(env: &Env) -> Checked {
    let mut rng = Rng::new(env.seed, 0xe30);
    let name = format!("NCCL_CCLKIT_CHECK_{:X}", rng.next_u64());
    let value = format!("v{:x}", rng.next_u64());
    // SAFETY: this child runs one check; the plugin is not loaded yet and no thread
    // of ours reads the environment meanwhile.
    unsafe { std::env::set_var(&name, &value) };
    let t = started(env)?;
    step(format!("getEnv({name}) set in the process environment"));
    let got = t.get(&name).map_err(Stop::Fail)?;
    if got != Answer::Value(value.clone().into_bytes()) {
        return fail!(
            "getEnv({name}) answered {} although the job set it to {value:?}: with this \
             plugin NCCL ignores the job's environment for that variable",
            got.show()
        );
    }
    let unset = format!("NCCL_CCLKIT_CHECK_UNSET_{:X}", rng.next_u64());
    let got = t.get(&unset).map_err(Stop::Fail)?;
    if got != Answer::Unset {
        return fail!("getEnv({unset}), set nowhere, answered {}", got.show());
    }
    Ok("a job variable reads back; an unset one reads NULL".into())
}

fn null_name_check(env: &Env) -> Checked {
    let t = started(env)?;
    step("getEnv(NULL)");
    // SAFETY: NULL is what this probe passes; a crash fails only this child.
    let a = unsafe { t.get_raw(std::ptr::null()) }.map_err(Stop::Fail)?;
    if a == Answer::TooLong {
        return fail!("getEnv(NULL) returned {}", a.show());
    }
    Ok(format!("getEnv(NULL) answered {}", a.show()))
}

fn long_name_check(env: &Env) -> Checked {
    let t = started(env)?;
    let name = format!("NCCL_{}", "L".repeat(64 * 1024 - 5));
    step("getEnv of a 64 KiB name");
    let a = t.get(&name).map_err(Stop::Fail)?;
    if a == Answer::TooLong {
        return fail!("getEnv(<64 KiB name>) returned {}", a.show());
    }
    Ok(format!("a 64 KiB name answered {}", a.show()))
}
