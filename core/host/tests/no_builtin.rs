//! The host links no transport of its own: until one is installed, a registry's walk
//! has nothing to fall back to and says so; once installed, it ends with it.

use cclkit_host::LoaderConfig;
use cclkit_host::net::{CommConfig, NetPlugin};
use cclkit_host::select::NetRegistry;

fn config(net: Option<&str>) -> LoaderConfig {
    LoaderConfig {
        net_plugin: net.map(str::to_owned),
        ..LoaderConfig::default()
    }
}

#[test]
fn the_walk_ends_with_the_installed_transport_only() {
    // One test in this binary: the installed transport is process-wide.
    assert!(NetPlugin::builtin().is_none());
    let missing = "cclkit-no-such-plugin-for-this-test";
    let e = NetRegistry::new(config(Some(missing)))
        .select(1, CommConfig::default())
        .err()
        .expect("nothing usable without a built-in transport");
    let text = e.to_string();
    assert!(text.contains(missing), "{text}");

    assert!(NetPlugin::install_builtin(
        &cclkit_net_socket::ncclNetPlugin_v12
    ));
    // Installing the same table again is a no-op that reports it installed.
    assert!(NetPlugin::install_builtin(
        &cclkit_net_socket::ncclNetPlugin_v12
    ));
    let sel = NetRegistry::new(config(Some(missing)))
        .select(2, CommConfig::default())
        .expect("falls back to the installed transport");
    assert!(sel.fell_back);
    assert_eq!(sel.context.plugin().name(), "cclkit-socket");
}
