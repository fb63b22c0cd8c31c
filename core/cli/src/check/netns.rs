//! Two network namespaces joined by a veth pair, for the cross-namespace check.
//!
//! Names come from the creating process id (`cclkit-<pid>-a`, veth `ck<pid>a`), so
//! concurrent runs never collide and the parent can remove what a killed child left
//! ([`cleanup_for`]). Dropping a [`Netns`] deletes both namespaces (the veth pair
//! goes with them).

use std::process::Command;

use super::Stop;

/// One end of the pair.
#[derive(Debug, Clone)]
pub(crate) struct Side {
    /// Namespace name.
    pub ns: String,
    /// veth interface inside it.
    pub ifname: String,
    /// Its IPv4 address.
    pub ip: String,
}

/// Two namespaces `a` and `b`, each with one end of a veth pair, addresses
/// 10.99.0.1/24 and 10.99.0.2/24 (namespaces are isolated, so concurrent pairs may
/// reuse them).
pub(crate) struct Netns {
    pub sides: [Side; 2],
}

fn names(pid: u32) -> [(String, String); 2] {
    [
        (format!("cclkit-{pid}-a"), format!("ck{pid}a")),
        (format!("cclkit-{pid}-b"), format!("ck{pid}b")),
    ]
}

/// Runs `ip ARGS`; `Err` carries its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// Creates the pair, or explains (as a SKIP) why it cannot here.
    pub fn create() -> Result<Self, Stop> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Stop::Skip(
                "not root: creating network namespaces and veth pairs needs root".into(),
            ));
        }
        if Command::new("ip").arg("-V").output().is_err() {
            return Err(Stop::Skip(
                "no `ip` command (iproute2 is not installed)".into(),
            ));
        }
        let [(na, va), (nb, vb)] = names(std::process::id());
        let ns = Self {
            sides: [
                Side {
                    ns: na.clone(),
                    ifname: va.clone(),
                    ip: "10.99.0.1".into(),
                },
                Side {
                    ns: nb.clone(),
                    ifname: vb.clone(),
                    ip: "10.99.0.2".into(),
                },
            ],
        };
        let setup = || -> Result<(), String> {
            ip(&["netns", "add", &na])?;
            ip(&["netns", "add", &nb])?;
            ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
            for s in &ns.sides {
                ip(&["link", "set", &s.ifname, "netns", &s.ns])?;
                let cidr = format!("{}/24", s.ip);
                ip(&["-n", &s.ns, "addr", "add", &cidr, "dev", &s.ifname])?;
                ip(&["-n", &s.ns, "link", "set", &s.ifname, "up"])?;
                ip(&["-n", &s.ns, "link", "set", "lo", "up"])?;
            }
            Ok(())
        };
        match setup().and_then(|()| ns.wait_carrier()) {
            Ok(()) => Ok(ns),
            // `ns` drops here and removes whatever was created.
            Err(e) => Err(Stop::Skip(format!(
                "cannot create network namespaces here: {e}"
            ))),
        }
    }

    /// Waits until both veth ends have carrier (`LOWER_UP`): the kernel brings a veth
    /// pair up asynchronously, and a plugin that lists usable interfaces right away
    /// would otherwise find none.
    fn wait_carrier(&self) -> Result<(), String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for s in &self.sides {
            loop {
                let out = Command::new("ip")
                    .args(["-n", &s.ns, "-o", "link", "show", "dev", &s.ifname])
                    .output()
                    .map_err(|e| format!("cannot run `ip`: {e}"))?;
                let text = String::from_utf8_lossy(&out.stdout);
                if text.contains("LOWER_UP") && text.contains("state UP") {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(format!(
                        "{} in {} never came up: {}",
                        s.ifname,
                        s.ns,
                        text.trim()
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// `ip netns exec <ns> <program>` for side `i`, with the peer environment set.
    pub fn command(
        &self,
        i: usize,
        program: &std::path::Path,
        env: &[(String, String)],
    ) -> Command {
        let s = &self.sides[i];
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &s.ns]).arg(program);
        for (k, v) in env {
            c.env(k, v.replace("{ip}", &s.ip).replace("{ifname}", &s.ifname));
        }
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for s in &self.sides {
            let _ = ip(&["netns", "del", &s.ns]);
        }
        // A veth end still in the root namespace (setup failed half-way).
        let _ = ip(&["link", "del", &self.sides[0].ifname]);
    }
}

/// Removes the namespaces a killed check process `pid` may have left.
pub(crate) fn cleanup_for(pid: u32) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    for (ns, veth) in names(pid) {
        if std::path::Path::new("/run/netns").join(&ns).exists() {
            let _ = ip(&["netns", "del", &ns]);
        }
        if std::path::Path::new("/sys/class/net").join(&veth).exists() {
            let _ = ip(&["link", "del", &veth]);
        }
    }
}

/// `<NAME>_IP` / `<NAME>_IFNAME` for a plugin named `name`: the table name upper-cased,
/// every other character than A-Z and 0-9 turned into `_` ("my-net" → `MY_NET_IP`).
pub(crate) fn name_vars(name: &str) -> [(String, String); 2] {
    let upper: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    [
        (format!("{upper}_IP"), "{ip}".to_owned()),
        (format!("{upper}_IFNAME"), "{ifname}".to_owned()),
    ]
}

/// The variables the peers of the namespace check get, pointing each plugin at the
/// veth: NCCL's `NCCL_SOCKET_IFNAME`, what cclkit's own plugins read, the naming
/// convention `<NAME>_IP` / `<NAME>_IFNAME` for the plugin `name` (what `make
/// new-plugin` crates read), then `--peer-env KEY=VALUE` (`{ip}`/`{ifname}` substituted).
pub(crate) fn default_env(name: &str, extra: &[String]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("NCCL_SOCKET_IFNAME", "={ifname}"),
        ("CCLKIT_TEMPLATE_IP", "{ip}"),
        ("CCLKIT_OFI_IFACE", "{ifname}"),
        ("CCLKIT_OFI_ADDR", "{ip}"),
        ("FI_TCP_IFACE", "{ifname}"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in name_vars(name) {
        env.retain(|(x, _)| *x != k);
        env.push((k, v));
    }
    for e in extra {
        if let Some((k, v)) = e.split_once('=') {
            env.retain(|(x, _)| x != k);
            env.push((k.to_owned(), v.to_owned()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_interface_limits_and_env_is_substituted() {
        let [(a, va), (_, vb)] = names(4_194_304);
        assert_eq!(a, "cclkit-4194304-a");
        assert!(va.len() < 16 && vb.len() < 16, "{va} {vb}");
        let env = default_env(
            "my-net",
            &[
                "FOO={ip}:{ifname}".into(),
                "CCLKIT_TEMPLATE_IP=1.2.3.4".into(),
            ],
        );
        assert!(env.contains(&("MY_NET_IP".into(), "{ip}".into())));
        assert!(env.contains(&("MY_NET_IFNAME".into(), "{ifname}".into())));
        assert!(env.contains(&("FOO".into(), "{ip}:{ifname}".into())));
        assert_eq!(
            env.iter()
                .filter(|(k, _)| k == "CCLKIT_TEMPLATE_IP")
                .count(),
            1
        );
        let ns = Netns {
            sides: [
                Side {
                    ns: "x".into(),
                    ifname: "vx".into(),
                    ip: "10.99.0.1".into(),
                },
                Side {
                    ns: "y".into(),
                    ifname: "vy".into(),
                    ip: "10.99.0.2".into(),
                },
            ],
        };
        let c = ns.command(1, std::path::Path::new("/bin/true"), &env);
        let vars: Vec<_> = c.get_envs().collect();
        assert!(
            vars.iter()
                .any(|(k, v)| *k == "FOO" && *v == Some("10.99.0.2:vy".as_ref()))
        );
        std::mem::forget(ns); // nothing was created
    }
}
