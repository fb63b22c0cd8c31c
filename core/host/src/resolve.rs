//! Which file names NCCL (or RCCL) passes to `dlopen` for a plugin setting.
//!
//! Pure functions, no I/O: [`net_entries`] splits `NCCL_NET_PLUGIN` the way
//! `src/plugin/net.cc` does, and [`candidates`] yields the names one entry is tried
//! under, in order, the way `src/plugin/plugin_open.cc` does (NCCL 2.30,
//! NCCL_ABI.md §3.1–3.3). Each rule cites where NCCL defines it.

use serde::Serialize;

use super::config::{Flavor, PluginKind};

/// `MAX_STR_LEN` in plugin_open.cc/net.cc: names are copied with
/// `snprintf(buf, 255, …)`, i.e. cut to 254 bytes.
pub const MAX_NAME_LEN: usize = 254;

/// `NCCL_NET_MAX_PLUGINS − 2` (net.cc): external net entries beyond this are ignored.
pub const MAX_EXTERNAL_NET_PLUGINS: usize = 14;

/// The rule that produced a candidate name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The setting's value, passed to `dlopen` unchanged (plugin_open.cc `openPluginLib`,
    /// first `tryOpenLib`): a plain name goes through the dynamic linker's search path,
    /// a path names the file.
    Verbatim,
    /// `<prefix>-<value>.so`, tried after the verbatim value failed, unless the value
    /// contains `/` or has the form `lib….so` (plugin_open.cc, second `tryOpenLib`;
    /// the exclusions date from NCCL 2.27.5).
    PrefixForm,
    /// `<prefix>.so` when the variable is unset or empty (plugin_open.cc, `libName`
    /// empty ⇒ `"%s.so", pluginPrefix[type]`).
    Default,
    /// The value is a case-insensitive prefix of `STATIC_PLUGIN`, so NCCL calls
    /// `dlopen(NULL)` and looks the symbols up in the main program (plugin_open.cc
    /// `tryOpenLib`, `strncasecmp(name, "STATIC_PLUGIN", strlen(name))`).
    StaticPlugin,
    /// No tuner library opened, so NCCL looks for tuner symbols in the loaded net
    /// plugin library (tuner.cc → plugin_open.cc `ncclGetNetPluginLib`).
    NetLibrary,
    /// A transport built into the host (NCCL appends IB then Socket; cclkit appends its
    /// socket transport), net.cc `initPluginLibsOnceFunc`.
    Builtin,
}

impl Rule {
    /// A short explanation for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Rule::Verbatim => "value as given",
            Rule::PrefixForm => "<prefix>-<value>.so form",
            Rule::Default => "default name (variable unset)",
            Rule::StaticPlugin => "STATIC_PLUGIN: symbols of the main program",
            Rule::NetLibrary => "tuner searched inside the net plugin library",
            Rule::Builtin => "built-in",
        }
    }
}

/// One name to try: `None` means `dlopen(NULL)` (the main program).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// The string handed to `dlopen`, `None` for the main program.
    pub name: Option<String>,
    /// Why this name is tried.
    pub rule: Rule,
}

/// One external entry of the net plugin list (`None` = the unset default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetEntry {
    /// The list element, or `None` when `NCCL_NET_PLUGIN` is unset.
    pub value: Option<String>,
}

/// The external net entries of a setting, plus notes on entries NCCL ignores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NetEntries {
    /// Entries in the order NCCL tries them.
    pub entries: Vec<NetEntry>,
    /// Entries NCCL drops, with the reason (too long, too many).
    pub ignored: Vec<String>,
    /// True when the value disables external plugins (`none`, or an empty list).
    pub disabled: bool,
}

/// The library-name prefix for a plugin kind (plugin_open.cc `pluginPrefix`; RCCL
/// renames only the net prefix).
pub fn prefix(kind: PluginKind, flavor: Flavor) -> &'static str {
    match (kind, flavor) {
        (PluginKind::Net, Flavor::Nccl) => "libnccl-net",
        (PluginKind::Net, Flavor::Rccl) => "librccl-net",
        (PluginKind::Tuner, _) => "libnccl-tuner",
    }
}

/// The name tried when the variable is unset (`libnccl-net.so`, `libnccl-tuner.so`, …).
pub fn default_name(kind: PluginKind, flavor: Flavor) -> String {
    format!("{}.so", prefix(kind, flavor))
}

/// True for `none` in any case: no external plugin (net.cc and tuner.cc, NCCL 2.28+).
pub fn is_none(value: &str) -> bool {
    value.eq_ignore_ascii_case("none")
}

/// True when NCCL would `dlopen(NULL)` for this name: it is a non-empty,
/// case-insensitive prefix of `STATIC_PLUGIN` ("s", "Static", "static_plugin", …).
pub fn is_static_plugin(name: &str) -> bool {
    const STATIC: &str = "STATIC_PLUGIN";
    !name.is_empty()
        && name.len() <= STATIC.len()
        && STATIC.as_bytes()[..name.len()].eq_ignore_ascii_case(name.as_bytes())
}

/// Splits `NCCL_NET_PLUGIN` into external entries (net.cc `initPluginLibsOnceFunc`):
/// unset ⇒ the default library; `none` ⇒ nothing; otherwise `strtok_r(",")` (empty
/// elements vanish, so a set-but-empty value also means no external plugin), at most
/// 14 entries, entries of 255 bytes or more skipped.
pub fn net_entries(value: Option<&str>) -> NetEntries {
    let Some(value) = value else {
        return NetEntries {
            entries: vec![NetEntry { value: None }],
            ..NetEntries::default()
        };
    };
    let mut out = NetEntries::default();
    if is_none(value) {
        out.disabled = true;
        return out;
    }
    for token in value.split(',').filter(|t| !t.is_empty()) {
        if out.entries.len() >= MAX_EXTERNAL_NET_PLUGINS {
            out.ignored.push(format!(
                "{token}: NCCL_NET_PLUGIN lists more than {MAX_EXTERNAL_NET_PLUGINS} plugins, \
                 the rest are ignored"
            ));
            continue;
        }
        if token.len() + 1 > MAX_NAME_LEN + 1 {
            out.ignored.push(format!(
                "{}…: longer than {MAX_NAME_LEN} characters, ignored",
                truncate(token, 32)
            ));
            continue;
        }
        out.entries.push(NetEntry {
            value: Some(token.to_owned()),
        });
    }
    out.disabled = out.entries.is_empty();
    out
}

/// The names one entry is tried under, in order (plugin_open.cc `openPluginLib`).
///
/// `value` is the entry (`None` or empty = unset). Returns an empty list for `none`.
pub fn candidates(kind: PluginKind, flavor: Flavor, value: Option<&str>) -> Vec<Candidate> {
    let value = value.filter(|v| !v.is_empty());
    let Some(value) = value else {
        return vec![Candidate {
            name: Some(default_name(kind, flavor)),
            rule: Rule::Default,
        }];
    };
    if is_none(value) {
        return Vec::new();
    }
    let verbatim = truncate(value, MAX_NAME_LEN);
    let mut out = vec![if is_static_plugin(verbatim) {
        Candidate {
            name: None,
            rule: Rule::StaticPlugin,
        }
    } else {
        Candidate {
            name: Some(verbatim.to_owned()),
            rule: Rule::Verbatim,
        }
    }];
    if wants_prefix_form(value) {
        let name = format!("{}-{value}.so", prefix(kind, flavor));
        out.push(Candidate {
            name: Some(truncate(&name, MAX_NAME_LEN).to_owned()),
            rule: Rule::PrefixForm,
        });
    }
    out
}

/// plugin_open.cc: the second attempt is skipped for a relative or absolute path
/// (contains `/`) and for a full library name (`lib` … `.so`).
pub fn wants_prefix_form(value: &str) -> bool {
    !(value.is_empty()
        || value.contains('/')
        || (value.starts_with("lib") && value.ends_with(".so")))
}

/// Settings that are legal but probably not what the user meant.
pub fn pitfalls(kind: PluginKind, value: &str) -> Vec<String> {
    let mut notes = Vec::new();
    let var = kind.env_var();
    if value != value.trim() {
        notes.push(format!(
            "{var} entry {value:?} has leading/trailing spaces; NCCL does not trim them"
        ));
    }
    if is_static_plugin(value) && !value.eq_ignore_ascii_case("STATIC_PLUGIN") {
        notes.push(format!(
            "{var}={value} is a prefix of STATIC_PLUGIN, so NCCL looks for the plugin \
             inside the application itself (dlopen(NULL)), not in a library"
        ));
    }
    if !value.contains('/') && value.ends_with(".so") && !value.starts_with("lib") {
        notes.push(format!(
            "{var}={value} ends in .so but does not start with 'lib', so NCCL also tries \
             '<prefix>-{value}.so' (note the doubled .so)"
        ));
    }
    if value.contains('/') && !value.starts_with('/') {
        notes.push(format!(
            "{var}={value} is a relative path: dlopen resolves it against the \
             application's current directory"
        ));
    }
    notes
}

/// The first `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(kind: PluginKind, flavor: Flavor, v: Option<&str>) -> Vec<(Option<String>, Rule)> {
        candidates(kind, flavor, v)
            .into_iter()
            .map(|c| (c.name, c.rule))
            .collect()
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn unset_tries_the_default_only() {
        assert_eq!(
            names(PluginKind::Net, Flavor::Nccl, None),
            [(some("libnccl-net.so"), Rule::Default)]
        );
        assert_eq!(
            names(PluginKind::Tuner, Flavor::Nccl, Some("")),
            [(some("libnccl-tuner.so"), Rule::Default)]
        );
        assert_eq!(
            names(PluginKind::Net, Flavor::Rccl, None),
            [(some("librccl-net.so"), Rule::Default)]
        );
        assert_eq!(
            names(PluginKind::Tuner, Flavor::Rccl, None),
            [(some("libnccl-tuner.so"), Rule::Default)]
        );
    }

    #[test]
    fn a_plain_name_is_tried_verbatim_then_in_prefix_form() {
        assert_eq!(
            names(PluginKind::Net, Flavor::Nccl, Some("aws-ofi")),
            [
                (some("aws-ofi"), Rule::Verbatim),
                (some("libnccl-net-aws-ofi.so"), Rule::PrefixForm)
            ]
        );
        assert_eq!(
            names(PluginKind::Net, Flavor::Rccl, Some("x")),
            [
                (some("x"), Rule::Verbatim),
                (some("librccl-net-x.so"), Rule::PrefixForm)
            ]
        );
        assert_eq!(
            names(PluginKind::Tuner, Flavor::Rccl, Some("x")),
            [
                (some("x"), Rule::Verbatim),
                (some("libnccl-tuner-x.so"), Rule::PrefixForm)
            ]
        );
    }

    #[test]
    fn paths_and_full_library_names_get_no_prefix_form() {
        assert_eq!(
            names(PluginKind::Net, Flavor::Nccl, Some("/opt/x/libfoo.so")),
            [(some("/opt/x/libfoo.so"), Rule::Verbatim)]
        );
        assert_eq!(
            names(PluginKind::Net, Flavor::Nccl, Some("./x")),
            [(some("./x"), Rule::Verbatim)]
        );
        assert_eq!(
            names(PluginKind::Tuner, Flavor::Nccl, Some("libfoo.so")),
            [(some("libfoo.so"), Rule::Verbatim)]
        );
        // Not of the form lib….so: the prefix form is tried (and doubles .so, as in NCCL).
        assert_eq!(
            names(PluginKind::Net, Flavor::Nccl, Some("foo.so"))[1],
            (some("libnccl-net-foo.so.so"), Rule::PrefixForm)
        );
        assert_eq!(
            names(PluginKind::Net, Flavor::Nccl, Some("libfoo.so.1"))[1],
            (some("libnccl-net-libfoo.so.1.so"), Rule::PrefixForm)
        );
    }

    #[test]
    fn static_plugin_prefixes_mean_the_main_program() {
        for v in ["STATIC_PLUGIN", "static_plugin", "s", "Static"] {
            assert!(is_static_plugin(v), "{v}");
            assert_eq!(
                names(PluginKind::Net, Flavor::Nccl, Some(v))[0],
                (None, Rule::StaticPlugin)
            );
        }
        for v in ["", "STATIC_PLUGINS", "stat1c", "x"] {
            assert!(!is_static_plugin(v), "{v}");
        }
    }

    #[test]
    fn none_disables() {
        assert!(names(PluginKind::Tuner, Flavor::Nccl, Some("NONE")).is_empty());
        let e = net_entries(Some("None"));
        assert!(e.disabled && e.entries.is_empty());
    }

    #[test]
    fn net_list_is_split_like_strtok() {
        let e = net_entries(Some("a,,b,"));
        let vals: Vec<_> = e.entries.iter().map(|x| x.value.clone()).collect();
        assert_eq!(vals, [some("a"), some("b")]);
        assert!(!e.disabled);
        // Set but empty: no external plugin at all (not the default).
        assert!(net_entries(Some("")).disabled);
        assert_eq!(net_entries(None).entries, [NetEntry { value: None }]);
    }

    #[test]
    fn net_list_limits() {
        let many: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
        let e = net_entries(Some(&many.join(",")));
        assert_eq!(e.entries.len(), MAX_EXTERNAL_NET_PLUGINS);
        assert_eq!(e.ignored.len(), 6);
        let long = "x".repeat(255);
        let e = net_entries(Some(&format!("{long},ok")));
        assert_eq!(e.entries, [NetEntry { value: some("ok") }]);
        assert_eq!(e.ignored.len(), 1);
    }

    #[test]
    fn pitfalls_are_explained() {
        assert_eq!(pitfalls(PluginKind::Net, " ofi").len(), 1);
        assert_eq!(pitfalls(PluginKind::Net, "s").len(), 1);
        assert_eq!(pitfalls(PluginKind::Net, "foo.so").len(), 1);
        assert_eq!(pitfalls(PluginKind::Net, "x/libfoo.so").len(), 1);
        assert!(pitfalls(PluginKind::Net, "ofi").is_empty());
    }
}
