//! `STATIC_PLUGIN` (any case-insensitive prefix of it): NCCL calls `dlopen(NULL)` and
//! looks the plugin symbols up in the program's global scope. Kept in its own test
//! binary because it loads a library with `RTLD_GLOBAL`.

mod common;

use cclkit_host::net::CommConfig;
use cclkit_host::select::{NetRegistry, Outcome};
use cclkit_host::{Cause, resolve::Rule};
use common::{Plugins, config};

#[test]
fn static_plugin_looks_in_the_program_itself() {
    // The test program exports no plugin table: unsupported, and the walk falls back.
    let reg = NetRegistry::new(config(Some("STATIC_PLUGIN"), None));
    let sel = reg.select(1, CommConfig::default()).expect("built-in");
    match &sel.attempts[0].outcome {
        Outcome::Failed(e) => {
            assert!(matches!(e.cause, Cause::NoSymbol { .. }), "{e}");
            assert_eq!(
                (e.opens[0].name.as_deref(), e.opens[0].rule),
                (None, Rule::StaticPlugin)
            );
            assert!(
                e.reason()
                    .starts_with("the main program (dlopen(NULL)) exports none of"),
                "{}",
                e.reason()
            );
        }
        o => panic!("{o:?}"),
    }
    // Once a library's symbols are global, dlopen(NULL) finds them ("s" is a prefix).
    let p = Plugins::new();
    let lib = p.net("global.so", 12, &["PLUGIN_NAME=\"Global\""]);
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading our own fixture; its initialisers do nothing.
    let _global = unsafe { Library::open(Some(&lib), RTLD_NOW | RTLD_GLOBAL) }.expect("global");
    let reg = NetRegistry::new(config(Some("s"), None));
    let sel = reg.select(1, CommConfig::default()).expect("selected");
    match &sel.attempts[0].outcome {
        Outcome::Selected(c) => {
            assert_eq!(
                (c.name.as_str(), c.rule, c.path.as_deref()),
                ("Global", Rule::StaticPlugin, None)
            )
        }
        o => panic!("{o:?}"),
    }
}
