//! `export_env!` through the raw tables, as NCCL calls them: both versions, random
//! names and values, the lifetime rule, and every failure path.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr, c_char};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use cclkit_abi::env::{Env, EnvInit, EnvValue, NcclVersion};
use cclkit_abi::export::env::EnvExport;
use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::env::{VERSIONS, symbol};
use cclkit_abi::{Error, Result, export_env};

/// What the next `init` builds, and what the last one saw.
struct Setup {
    values: Vec<(String, String)>,
    fail_init: bool,
    panic_init: bool,
    seen: Option<(u32, NcclVersion, String)>,
}

static SETUP: Mutex<Setup> = Mutex::new(Setup {
    values: Vec::new(),
    fail_init: false,
    panic_init: false,
    seen: None,
});
/// One env plugin per process: tests touching it run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn setup() -> MutexGuard<'static, Setup> {
    SETUP.lock().unwrap_or_else(|e| e.into_inner())
}

struct MapEnv {
    values: HashMap<String, String>,
    ticks: AtomicU64,
}

impl Env for MapEnv {
    const NAME: &'static CStr = c"MapEnv";

    fn init(args: EnvInit<'_>) -> Result<Self> {
        let mut s = setup();
        s.seen = Some((args.host_abi, args.nccl_version, args.suffix.to_owned()));
        if s.panic_init {
            panic!("init panics on purpose");
        }
        if s.fail_init {
            return Err(Error::invalid_usage("refused on purpose"));
        }
        Ok(Self {
            values: s.values.iter().cloned().collect(),
            ticks: AtomicU64::new(0),
        })
    }

    fn get_env(&self, name: &str) -> Result<Option<EnvValue<'_>>> {
        match name {
            "TEST_PANIC" => panic!("getEnv panics on purpose"),
            "TEST_ERROR" => Err(Error::internal("getEnv fails on purpose")),
            "TEST_NUL" => Ok(Some(Cow::Borrowed(OsStr::new("a\0b")))),
            // A value that changes on every call, cycling through 5 values.
            "TEST_CHANGING" => {
                let t = self.ticks.fetch_add(1, Ordering::Relaxed) % 5;
                Ok(Some(Cow::Owned(
                    format!("tick-{t}-{}", "x".repeat(t as usize)).into(),
                )))
            }
            _ => Ok(self.values.get(name).map(|v| Cow::Borrowed(OsStr::new(v)))),
        }
    }
}

export_env!(MapEnv);

/// splitmix64: deterministic from a printed seed, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = std::env::var("CCLKIT_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(7, |d| d.as_nanos() as u64)
            });
        eprintln!("seed {seed} (CCLKIT_TEST_SEED to replay)");
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An odd-length value mixing ASCII, punctuation and multi-byte characters.
    fn value(&mut self) -> String {
        const PARTS: [&str; 8] = ["a", "Z", "9", ",", "=", " ", "é", "日"];
        let len = self.below(97) as usize;
        (0..len)
            .map(|_| PARTS[self.below(PARTS.len() as u64) as usize])
            .collect()
    }
}

fn init(version: u32, v: NcclVersion, suffix: &CStr) -> NcclResult {
    // SAFETY: the exported tables' functions, called with valid arguments.
    unsafe {
        match version {
            1 => (ncclEnvPlugin_v1.init.expect("v1 init"))(
                v.major,
                v.minor,
                v.patch,
                suffix.as_ptr(),
            ),
            _ => (ncclEnvPlugin_v2.init.expect("v2 init"))(
                v.major,
                v.minor,
                v.patch,
                suffix.as_ptr(),
                None,
            ),
        }
    }
}

fn get_raw(version: u32, name: *const c_char) -> *const c_char {
    let f = match version {
        1 => ncclEnvPlugin_v1.getEnv,
        _ => ncclEnvPlugin_v2.getEnv,
    };
    // SAFETY: getEnv accepts any pointer NCCL could pass, NULL included.
    unsafe { (f.expect("getEnv"))(name) }
}

fn get(version: u32, name: &str) -> Option<(usize, String)> {
    let name = CString::new(name).expect("test name");
    let p = get_raw(version, name.as_ptr());
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL result is a NUL-terminated string valid until finalize.
    Some((p as usize, unsafe { read(p) }))
}

/// # Safety
/// `p` is a live NUL-terminated string.
unsafe fn read(p: *const c_char) -> String {
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .expect("UTF-8")
        .to_owned()
}

fn finalize(version: u32) -> NcclResult {
    let f = match version {
        1 => ncclEnvPlugin_v1.finalize,
        _ => ncclEnvPlugin_v2.finalize,
    };
    // SAFETY: the exported finalize takes no arguments.
    unsafe { (f.expect("finalize"))() }
}

fn fresh(values: HashMap<String, String>) {
    let mut s = setup();
    s.values = values.into_iter().collect();
    s.fail_init = false;
    s.panic_init = false;
    s.seen = None;
}

#[test]
fn tables_name_the_plugin_and_symbols_match_nccl() {
    // SAFETY: `name` points to the plugin's static NUL-terminated name.
    let (n1, n2) = unsafe {
        (
            CStr::from_ptr(ncclEnvPlugin_v1.name),
            CStr::from_ptr(ncclEnvPlugin_v2.name),
        )
    };
    assert_eq!((n1, n2), (c"MapEnv", c"MapEnv"));
    assert_eq!(VERSIONS, [2, 1]);
    assert_eq!(symbol(2), Some("ncclEnvPlugin_v2\0"));
    assert_eq!(symbol(1), Some("ncclEnvPlugin_v1\0"));
    assert_eq!(symbol(3), None);
    assert_eq!(
        ncclEnvPlugin_v1.getEnv.map(|f| f as usize),
        ncclEnvPlugin_v2.getEnv.map(|f| f as usize),
        "both versions share one getEnv"
    );
}

#[test]
fn every_version_returns_exact_random_values() {
    let _s = serial();
    let mut rng = Rng::new();
    for version in VERSIONS {
        let values: HashMap<String, String> = (0..1 + rng.below(40))
            .map(|i| (format!("NCCL_T{i}_{}", rng.below(1000)), rng.value()))
            .collect();
        fresh(values.clone());
        let v = NcclVersion {
            major: rng.below(256) as u8,
            minor: rng.below(256) as u8,
            patch: rng.below(256) as u8,
        };
        let suffix = CString::new(format!("+cuda{}", rng.below(100))).expect("suffix");
        assert_eq!(init(version, v, &suffix), NcclResult::SUCCESS);
        assert_eq!(
            setup().seen,
            Some((version, v, suffix.to_str().expect("ascii").to_owned()))
        );
        assert!(MapEnv::state().is_live());
        let mut addr = HashMap::new();
        for round in 0..3 {
            for (name, value) in &values {
                let (p, got) = get(version, name).expect("set variable");
                assert_eq!(&got, value, "{name} (ABI v{version})");
                // The same name and value always come back at the same address.
                assert_eq!(*addr.entry(name.clone()).or_insert(p), p, "round {round}");
            }
            assert_eq!(get(version, "NCCL_NOT_SET_ANYWHERE"), None);
        }
        assert_eq!(MapEnv::state().handed_out(), values.len());
        assert_eq!(finalize(version), NcclResult::SUCCESS);
        assert!(!MapEnv::state().is_live());
        assert_eq!(MapEnv::state().handed_out(), 0);
        // After finalize every name reads as unset rather than touching freed memory.
        let some = values.keys().next().expect("at least one");
        assert_eq!(get(version, some), None);
    }
}

#[test]
fn returned_strings_stay_valid_until_finalize() {
    let _s = serial();
    fresh(HashMap::new());
    assert_eq!(
        init(
            2,
            NcclVersion {
                major: 2,
                minor: 30,
                patch: 7
            },
            c""
        ),
        NcclResult::SUCCESS
    );
    let name = c"TEST_CHANGING";
    let mut seen: Vec<(*const c_char, String)> = Vec::new();
    for _ in 0..23 {
        let p = get_raw(2, name.as_ptr());
        assert!(!p.is_null());
        // SAFETY: just returned, valid until finalize.
        seen.push((p, unsafe { read(p) }));
    }
    // Every pointer, old ones included, still reads the value it was returned with.
    for (p, text) in &seen {
        // SAFETY: the lifetime rule under test says these are still live.
        assert_eq!(unsafe { read(*p) }, *text);
    }
    let distinct: std::collections::HashSet<_> = seen.iter().map(|(p, _)| *p).collect();
    assert_eq!(distinct.len(), 5, "one string per distinct value");
    assert_eq!(MapEnv::state().handed_out(), 5);
    for (p, text) in &seen {
        assert!(
            seen.iter().all(|(q, t)| (q == p) == (t == text)),
            "equal values share an address, different values do not"
        );
    }
    assert_eq!(finalize(2), NcclResult::SUCCESS);
}

#[test]
fn failures_read_as_unset_and_are_contained() {
    let _s = serial();
    let mut values = HashMap::new();
    values.insert("NCCL_OK".to_owned(), "fine".to_owned());
    fresh(values);
    let v = NcclVersion {
        major: 2,
        minor: 28,
        patch: 7,
    };
    assert_eq!(init(1, v, c""), NcclResult::SUCCESS);
    for version in VERSIONS {
        assert_eq!(get(version, "TEST_PANIC"), None);
        assert_eq!(get(version, "TEST_ERROR"), None);
        assert_eq!(get(version, "TEST_NUL"), None);
        assert!(get_raw(version, std::ptr::null()).is_null());
        let not_utf8 = [b'N', 0xff, b'X', 0];
        assert!(get_raw(version, not_utf8.as_ptr().cast()).is_null());
        // The plugin keeps working after each of them.
        assert_eq!(
            get(version, "NCCL_OK").map(|(_, s)| s).as_deref(),
            Some("fine")
        );
    }
    // A second init is refused and the first instance (and its strings) survive.
    let before = get(2, "NCCL_OK").expect("set");
    assert_eq!(init(2, v, c""), NcclResult::INVALID_USAGE);
    assert_eq!(get(2, "NCCL_OK"), Some(before));
    assert_eq!(finalize(1), NcclResult::SUCCESS);
    assert_eq!(finalize(1), NcclResult::INVALID_USAGE, "finalize twice");

    setup().fail_init = true;
    assert_eq!(init(2, v, c""), NcclResult::INVALID_USAGE);
    assert!(!MapEnv::state().is_live());
    assert_eq!(get(2, "NCCL_OK"), None, "getEnv after a failed init");
    setup().fail_init = false;
    setup().panic_init = true;
    assert_eq!(init(1, v, c""), NcclResult::INTERNAL_ERROR);
    assert!(!MapEnv::state().is_live());
    setup().panic_init = false;
    assert_eq!(init(1, v, c""), NcclResult::SUCCESS, "init works again");
    assert_eq!(finalize(2), NcclResult::SUCCESS);
}

#[test]
fn concurrent_get_env_returns_each_threads_values() {
    let _s = serial();
    let mut rng = Rng::new();
    let values: HashMap<String, String> = (0..64)
        .map(|i| (format!("NCCL_C{i}"), rng.value()))
        .collect();
    fresh(values.clone());
    assert_eq!(
        init(
            2,
            NcclVersion {
                major: 2,
                minor: 30,
                patch: 7
            },
            c""
        ),
        NcclResult::SUCCESS
    );
    let seeds: Vec<u64> = (0..4).map(|_| rng.next()).collect();
    std::thread::scope(|scope| {
        for seed in seeds {
            let values = &values;
            scope.spawn(move || {
                let mut rng = Rng(seed);
                for _ in 0..2000 {
                    let i = rng.below(70);
                    let name = format!("NCCL_C{i}");
                    let got = get(1 + (i as u32 & 1), &name).map(|(_, s)| s);
                    assert_eq!(got.as_ref(), values.get(&name), "{name}");
                }
            });
        }
    });
    assert_eq!(MapEnv::state().handed_out(), 64);
    assert_eq!(finalize(2), NcclResult::SUCCESS);
}
