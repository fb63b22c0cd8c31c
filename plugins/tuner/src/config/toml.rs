//! cclkit's TOML rule format (see the crate README for the full description).
//!
//! ```toml
//! [model]
//! net_bw = 50.0
//!
//! [[rule]]
//! collective = ["allreduce", "reducescatter"]
//! size = "0..64K"          # 64K excluded; "64K..=1M", "1M..", "4096" also work
//! nodes = "2.."
//! algorithm = "tree"
//! protocol = "ll"
//! channels = 8
//!
//! [defaults.allreduce]     # after every [[rule]]
//! algorithm = "ring"
//! protocol = "simple"
//! chunk_size = "512K"
//! ```
//!
//! Unlike the CSV reader this one is strict: unknown keys and names are errors.

use std::fmt::Write as _;

use ::toml::Spanned;
use ::toml::de::{DeTable, DeValue};

use super::names::{self, ALGORITHMS, COLLECTIVES, PROTOCOLS};
use super::{CollSet, Interval, ModelSettings, Rule, RuleSet, Sink};
use super::{format_size, parse_interval, parse_size};
use crate::hw::{Arch, IntraLink};

/// Byte offset → 1-based line.
struct Lines(Vec<usize>);

impl Lines {
    fn new(text: &str) -> Self {
        Self(
            text.bytes()
                .enumerate()
                .filter(|(_, b)| *b == b'\n')
                .map(|(i, _)| i)
                .collect(),
        )
    }

    fn of(&self, offset: usize) -> u32 {
        u32::try_from(self.0.partition_point(|nl| *nl < offset) + 1).unwrap_or(u32::MAX)
    }
}

struct Ctx<'s, 'f> {
    lines: Lines,
    sink: &'s mut Sink<'f>,
}

impl Ctx<'_, '_> {
    fn line<T>(&self, v: &Spanned<T>) -> u32 {
        self.lines.of(v.span().start)
    }

    fn error<T>(&mut self, at: &Spanned<T>, msg: impl Into<String>) {
        let line = self.line(at);
        self.sink.error(line, msg);
    }
}

const RULE_KEYS: [&str; 10] = [
    "collective",
    "size",
    "nodes",
    "ranks",
    "pipe_ops",
    "reg_buff",
    "algorithm",
    "protocol",
    "channels",
    "chunk_size",
];
const ACTION_KEYS: [&str; 4] = ["algorithm", "protocol", "channels", "chunk_size"];
const MODEL_KEYS: [&str; 6] = [
    "intra_bw",
    "net_bw",
    "net_lat",
    "intra_link",
    "arch",
    "channels",
];

pub(super) fn parse(text: &str, sink: &mut Sink<'_>) -> RuleSet {
    let mut cx = Ctx {
        lines: Lines::new(text),
        sink,
    };
    let root = match DeTable::parse(text) {
        Ok(t) => t,
        Err(e) => {
            let line = e.span().map_or(1, |s| cx.lines.of(s.start));
            cx.sink
                .error(line, format!("invalid TOML: {}", e.message().trim()));
            return RuleSet::default();
        }
    };
    let mut set = RuleSet::default();
    let mut defaults = Vec::new();
    // Keys come sorted; handle them in a fixed order so output is stable.
    for (key, value) in root.get_ref().iter() {
        match key.get_ref().as_ref() {
            "rule" => match value.get_ref() {
                DeValue::Array(items) => {
                    for item in items.iter() {
                        if let Some(r) = rule(&mut cx, item) {
                            set.rules.push(r);
                        }
                    }
                }
                _ => cx.error(key, "`rule` must be written as [[rule]] tables"),
            },
            "defaults" => defaults_table(&mut cx, value, &mut defaults),
            "model" => set.model = model(&mut cx, value),
            other => cx.error(
                key,
                format!(
                    "unknown top-level key `{other}` (expected [[rule]], [defaults] or [model])"
                ),
            ),
        }
    }
    // Rules are matched in file order; the array keeps it. Defaults follow, the
    // per-collective ones before the all-collective one.
    defaults.sort_by_key(|r: &Rule| r.collectives == CollSet::ALL);
    set.rules.extend(defaults);
    set
}

fn table<'a, 'i>(
    cx: &mut Ctx<'_, '_>,
    v: &'a Spanned<DeValue<'i>>,
    what: &str,
) -> Option<&'a DeTable<'i>> {
    match v.get_ref() {
        DeValue::Table(t) => Some(t),
        other => {
            cx.error(
                v,
                format!("{what} must be a table, not {}", other.type_str()),
            );
            None
        }
    }
}

fn rule(cx: &mut Ctx<'_, '_>, item: &Spanned<DeValue<'_>>) -> Option<Rule> {
    let t = table(cx, item, "[[rule]]")?;
    let line = cx.line(item);
    let errors_before = cx.sink.out.len();
    let mut r = Rule {
        line,
        ..Rule::any()
    };
    for (k, v) in t.iter() {
        let key = k.get_ref().as_ref();
        match key {
            "collective" => {
                if let Some(c) = collectives(cx, v) {
                    r.collectives = c;
                }
            }
            "size" => r.bytes = interval(cx, v, key, true).unwrap_or(r.bytes),
            "nodes" => r.nodes = interval(cx, v, key, false).unwrap_or(r.nodes),
            "ranks" => r.ranks = interval(cx, v, key, false).unwrap_or(r.ranks),
            "pipe_ops" => r.pipe_ops = interval(cx, v, key, false).unwrap_or(r.pipe_ops),
            "reg_buff" => r.reg_buff = boolean(cx, v, key),
            _ if ACTION_KEYS.contains(&key) => action(cx, key, v, &mut r),
            other => cx.error(
                k,
                format!(
                    "unknown key `{other}` in [[rule]] (expected {})",
                    RULE_KEYS.join(", ")
                ),
            ),
        }
    }
    // A rule whose keys were already reported would only add noise here.
    let clean = cx.sink.out.len() == errors_before;
    if clean && !r.acts_on_coll_info() && r.chunk_size.is_none() {
        cx.sink.error(
            line,
            "[[rule]] sets nothing: give algorithm, protocol, channels or chunk_size",
        );
    }
    if r.chunk_size.is_some() && (!r.pipe_ops.is_any() || r.reg_buff.is_some()) {
        cx.sink.error(
            line,
            "chunk_size cannot be combined with pipe_ops or reg_buff \
             (NCCL does not pass them to getChunkSize)",
        );
    }
    (cx.sink.out.len() == errors_before).then_some(r)
}

fn defaults_table(cx: &mut Ctx<'_, '_>, v: &Spanned<DeValue<'_>>, out: &mut Vec<Rule>) {
    let Some(t) = table(cx, v, "[defaults]") else {
        return;
    };
    let mut all = Rule {
        is_default: true,
        line: cx.line(v),
        ..Rule::any()
    };
    for (k, sub) in t.iter() {
        let key = k.get_ref().as_ref();
        if ACTION_KEYS.contains(&key) {
            action(cx, key, sub, &mut all);
            continue;
        }
        let Some(func) = names::loose(&COLLECTIVES, key) else {
            cx.error(
                k,
                format!(
                    "unknown key `{key}` in [defaults] (expected {}, or a collective: {})",
                    ACTION_KEYS.join(", "),
                    names::expected(&COLLECTIVES)
                ),
            );
            continue;
        };
        let Some(st) = table(cx, sub, "[defaults.<collective>]") else {
            continue;
        };
        let mut r = Rule {
            collectives: CollSet::single(func).unwrap_or(CollSet::EMPTY),
            is_default: true,
            line: cx.line(sub),
            ..Rule::any()
        };
        for (k2, v2) in st.iter() {
            let key2 = k2.get_ref().as_ref();
            if ACTION_KEYS.contains(&key2) {
                action(cx, key2, v2, &mut r);
            } else {
                cx.error(
                    k2,
                    format!(
                        "unknown key `{key2}` in [defaults.{key}] (expected {})",
                        ACTION_KEYS.join(", ")
                    ),
                );
            }
        }
        if r.acts_on_coll_info() || r.chunk_size.is_some() {
            out.push(r);
        }
    }
    if all.acts_on_coll_info() || all.chunk_size.is_some() {
        out.push(all);
    }
}

fn action(cx: &mut Ctx<'_, '_>, key: &str, v: &Spanned<DeValue<'_>>, r: &mut Rule) {
    match key {
        "algorithm" => r.algorithm = name(cx, v, "algorithm", &ALGORITHMS),
        "protocol" => r.protocol = name(cx, v, "protocol", &PROTOCOLS),
        "channels" => match integer(cx, v, key) {
            Some(c) if (1..=i64::from(i32::MAX)).contains(&c) => r.channels = Some(c as u32),
            Some(c) => cx.error(v, format!("`channels` must be at least 1, got {c}")),
            None => {}
        },
        "chunk_size" => {
            let size = match v.get_ref() {
                DeValue::String(s) => parse_size(s)
                    .map_err(|e| cx.error(v, format!("`chunk_size`: {e}")))
                    .ok(),
                _ => integer(cx, v, key).and_then(|i| u64::try_from(i).ok()),
            };
            match size {
                Some(0) => cx.error(v, "`chunk_size` must be greater than 0"),
                Some(s) => r.chunk_size = Some(s),
                None => {}
            }
        }
        _ => {}
    }
}

fn name<T: Copy>(
    cx: &mut Ctx<'_, '_>,
    v: &Spanned<DeValue<'_>>,
    what: &str,
    table: &[(&'static str, T)],
) -> Option<T> {
    let DeValue::String(s) = v.get_ref() else {
        cx.error(v, format!("`{what}` must be a string"));
        return None;
    };
    let found = names::loose(table, s);
    if found.is_none() {
        cx.error(
            v,
            format!(
                "unknown {what} \"{s}\" (expected {})",
                names::expected(table)
            ),
        );
    }
    found
}

fn collectives(cx: &mut Ctx<'_, '_>, v: &Spanned<DeValue<'_>>) -> Option<CollSet> {
    let one = |cx: &mut Ctx<'_, '_>, v: &Spanned<DeValue<'_>>| -> Option<CollSet> {
        if let DeValue::String(s) = v.get_ref()
            && (s.as_ref() == "*" || s.eq_ignore_ascii_case("any"))
        {
            return Some(CollSet::ALL);
        }
        name(cx, v, "collective", &COLLECTIVES).and_then(CollSet::single)
    };
    match v.get_ref() {
        DeValue::Array(items) if items.is_empty() => {
            cx.error(v, "`collective` must not be an empty list");
            None
        }
        DeValue::Array(items) => {
            let mut set = CollSet::EMPTY;
            for it in items.iter() {
                let s = one(cx, it)?;
                set = CollSet(set.0 | s.0);
            }
            Some(set)
        }
        _ => one(cx, v),
    }
}

fn integer(cx: &mut Ctx<'_, '_>, v: &Spanned<DeValue<'_>>, key: &str) -> Option<i64> {
    match v.get_ref() {
        DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) => Some(n),
            Err(_) => {
                cx.error(v, format!("`{key}`: {i} is out of range"));
                None
            }
        },
        other => {
            cx.error(
                v,
                format!("`{key}` must be an integer, not {}", other.type_str()),
            );
            None
        }
    }
}

fn interval(
    cx: &mut Ctx<'_, '_>,
    v: &Spanned<DeValue<'_>>,
    key: &str,
    sizes: bool,
) -> Option<Interval> {
    match v.get_ref() {
        DeValue::String(s) => match parse_interval(s, sizes) {
            Ok(iv) => Some(iv),
            Err(e) => {
                cx.error(v, format!("`{key}`: {e}"));
                None
            }
        },
        DeValue::Integer(_) => match integer(cx, v, key)? {
            n if n >= 0 => Some(Interval::exact(n as u64)),
            n => {
                cx.error(
                    v,
                    format!("`{key}` must not be negative, got {n} (omit the key to match any)"),
                );
                None
            }
        },
        other => {
            cx.error(
                v,
                format!(
                    "`{key}` must be an integer or a range string like \"2..8\", not {}",
                    other.type_str()
                ),
            );
            None
        }
    }
}

fn boolean(cx: &mut Ctx<'_, '_>, v: &Spanned<DeValue<'_>>, key: &str) -> Option<bool> {
    match v.get_ref() {
        DeValue::Boolean(b) => Some(*b),
        DeValue::Integer(i) if i.as_str() == "0" => Some(false),
        DeValue::Integer(i) if i.as_str() == "1" => Some(true),
        _ => {
            cx.error(v, format!("`{key}` must be true or false"));
            None
        }
    }
}

fn number(cx: &mut Ctx<'_, '_>, v: &Spanned<DeValue<'_>>, key: &str, min: f64) -> Option<f64> {
    let n = match v.get_ref() {
        DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
        DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
            .ok()
            .map(|i| i as f64),
        _ => None,
    };
    match n {
        Some(n) if n.is_finite() && n >= min && !(min > 0.0 && n == 0.0) => Some(n),
        _ if min > 0.0 => {
            cx.error(v, format!("`{key}` must be a positive number"));
            None
        }
        _ => {
            cx.error(v, format!("`{key}` must be a number ≥ 0"));
            None
        }
    }
}

fn model(cx: &mut Ctx<'_, '_>, v: &Spanned<DeValue<'_>>) -> ModelSettings {
    let mut m = ModelSettings::default();
    let Some(t) = table(cx, v, "[model]") else {
        return m;
    };
    for (k, v) in t.iter() {
        let key = k.get_ref().as_ref();
        match key {
            "intra_bw" => m.intra_bw = number(cx, v, key, f64::MIN_POSITIVE),
            "net_bw" => m.net_bw = number(cx, v, key, f64::MIN_POSITIVE),
            "net_lat" => m.net_lat = number(cx, v, key, 0.0),
            "intra_link" | "arch" => {
                let DeValue::String(s) = v.get_ref() else {
                    cx.error(v, format!("`{key}` must be a string"));
                    continue;
                };
                let parsed = if key == "arch" {
                    Arch::parse(s).map(|a| m.arch = Some(a))
                } else {
                    IntraLink::parse(s).map(|l| m.intra_link = Some(l))
                };
                if let Err(e) = parsed {
                    cx.error(v, format!("`{key}`: {e}"));
                }
            }
            "channels" => match integer(cx, v, key) {
                Some(c) if (1..=1024).contains(&c) => m.channels = Some(c as u32),
                Some(c) => cx.error(v, format!("`channels` must be 1 to 1024, got {c}")),
                None => {}
            },
            other => cx.error(
                k,
                format!(
                    "unknown key `{other}` in [model] (expected {})",
                    MODEL_KEYS.join(", ")
                ),
            ),
        }
    }
    m
}

fn write_action(out: &mut String, r: &Rule) {
    if let Some(a) = r.algorithm {
        let _ = writeln!(out, "algorithm = \"{}\"", names::algorithm_name(a));
    }
    if let Some(p) = r.protocol {
        let _ = writeln!(out, "protocol = \"{}\"", names::protocol_name(p));
    }
    if let Some(c) = r.channels {
        let _ = writeln!(out, "channels = {c}");
    }
    if let Some(c) = r.chunk_size {
        let _ = writeln!(out, "chunk_size = \"{}\"", format_size(c));
    }
}

fn is_plain_default(r: &Rule) -> bool {
    r.is_default
        && r.bytes.is_any()
        && r.nodes.is_any()
        && r.ranks.is_any()
        && r.pipe_ops.is_any()
        && r.reg_buff.is_none()
}

pub(super) fn write(set: &RuleSet) -> String {
    let mut out = String::from("# cclkit tuner rules\n");
    let m = &set.model;
    if !m.is_empty() {
        out.push_str("\n[model]\n");
        let mut num = |k: &str, v: Option<f64>| {
            if let Some(v) = v {
                let _ = writeln!(out, "{k} = {v:?}");
            }
        };
        num("intra_bw", m.intra_bw);
        num("net_bw", m.net_bw);
        num("net_lat", m.net_lat);
        if let Some(l) = m.intra_link {
            let _ = writeln!(out, "intra_link = \"{}\"", l.name());
        }
        if let Some(a) = m.arch {
            let _ = writeln!(out, "arch = \"{}\"", a.name());
        }
        if let Some(c) = m.channels {
            let _ = writeln!(out, "channels = {c}");
        }
    }
    for r in set.rules.iter().filter(|r| !is_plain_default(r)) {
        if [r.bytes, r.nodes, r.ranks, r.pipe_ops]
            .iter()
            .any(Interval::is_empty)
            || r.collectives.is_empty()
        {
            // Only a CSV rule can be empty (min_bytes > max_bytes); it never matches.
            let _ = writeln!(out, "\n# rule from line {} never matches; left out", r.line);
            continue;
        }
        out.push_str("\n[[rule]]\n");
        if r.collectives != CollSet::ALL {
            let list: Vec<String> = r
                .collectives
                .iter()
                .map(|f| format!("\"{}\"", names::collective_name(f)))
                .collect();
            if list.len() == 1 {
                let _ = writeln!(out, "collective = {}", list.join(""));
            } else {
                let _ = writeln!(out, "collective = [{}]", list.join(", "));
            }
        }
        let mut iv = |k: &str, v: Interval, sizes: bool| {
            if v.is_any() {
                return;
            }
            match v.exact_value() {
                Some(x) if !sizes => {
                    let _ = writeln!(out, "{k} = {x}");
                }
                _ => {
                    let _ = writeln!(out, "{k} = \"{}\"", v.display(sizes));
                }
            }
        };
        iv("size", r.bytes, true);
        iv("nodes", r.nodes, false);
        iv("ranks", r.ranks, false);
        iv("pipe_ops", r.pipe_ops, false);
        if let Some(b) = r.reg_buff {
            let _ = writeln!(out, "reg_buff = {b}");
        }
        write_action(&mut out, r);
    }
    let defaults: Vec<&Rule> = set.rules.iter().filter(|r| is_plain_default(r)).collect();
    for r in &defaults {
        if r.collectives == CollSet::ALL {
            continue;
        }
        for f in r.collectives.iter() {
            let _ = writeln!(out, "\n[defaults.{}]", names::collective_name(f));
            write_action(&mut out, r);
        }
    }
    if let Some(all) = defaults.iter().find(|r| r.collectives == CollSet::ALL) {
        out.push_str("\n[defaults]\n");
        write_action(&mut out, all);
    }
    out
}
