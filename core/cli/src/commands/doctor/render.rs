//! The text form of a doctor report: one block per plugin kind, one numbered entry per
//! plugin considered, one line per `dlopen`, then notes, problems and the verdict.

use std::fmt::Write as _;

use super::{DoctorReport, Section, Step};
use cclkit_host::error::OpenOutcome;
use cclkit_host::select::Outcome;

/// Renders the report.
pub fn render(r: &DoctorReport) -> String {
    let mut o = String::new();
    let lib = r.flavor.library();
    let _ = writeln!(
        o,
        "cclkit doctor: the plugin resolution {lib} 2.30 would do here"
    );
    let set: Vec<String> = r
        .settings
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => format!("{k} unset"),
        })
        .collect();
    let _ = writeln!(o, "  {}", set.join("; "));
    super::env::render(&mut o, &r.env);
    if let Some(rules) = &r.release {
        super::release::render(&mut o, rules);
    }
    section(&mut o, "NET", &r.net);
    if !r.net.devices.is_empty() {
        let _ = writeln!(o, "  devices of the selected plugin:");
        for d in &r.net.devices {
            let _ = writeln!(o, "    {}", d.line());
        }
    }
    section(&mut o, "TUNER", &r.tuner);
    if !r.tuner.decisions.is_empty() {
        let _ = writeln!(o, "  sample decisions (no NVLS/CollNet offered):");
        for d in &r.tuner.decisions {
            let _ = match &d.choice {
                Ok(c) => writeln!(
                    o,
                    "    {} {} B -> {c}{}{}",
                    d.collective,
                    d.bytes,
                    if d.channels > 0 {
                        format!(", {} channels", d.channels)
                    } else {
                        String::new()
                    },
                    d.model
                        .as_ref()
                        .map_or_else(String::new, |m| format!(" (built-in model alone: {m})"))
                ),
                Err(e) => writeln!(o, "    {} {} B -> ERROR: {e}", d.collective, d.bytes),
            };
        }
    }
    super::profiler::render(&mut o, &r.profiler);
    super::gdr::render(&mut o, &r.gpu);
    if !r.notes.is_empty() {
        let _ = writeln!(o, "\nNotes:");
        for n in &r.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    if !r.problems.is_empty() {
        let _ = writeln!(o, "\nProblems:");
        for p in &r.problems {
            let _ = writeln!(o, "  - {p}");
        }
    }
    let _ = writeln!(o, "\nVerdict: {}", r.verdict);
    o
}

fn section(o: &mut String, title: &str, s: &Section) {
    let _ = writeln!(o, "\n{title}");
    for (i, step) in s.steps.iter().enumerate() {
        entry(o, i + 1, step);
    }
    if let Some(c) = &s.chosen {
        let _ = writeln!(
            o,
            "  => {title} uses {c}{}",
            if s.fell_back { " (FALLBACK)" } else { "" }
        );
    }
}

fn entry(o: &mut String, n: usize, step: &Step) {
    let a = &step.attempt;
    let _ = writeln!(o, "  [{n}] {}", a.label);
    for op in &step.opens {
        let name = op.open.shown_name();
        let rule = op.open.rule.describe();
        let _ = match &op.open.outcome {
            OpenOutcome::Loaded { path } => writeln!(
                o,
                "      dlopen(\"{name}\") [{rule}]: loaded {}",
                path.as_deref().unwrap_or("")
            ),
            OpenOutcome::NotFound { .. } => {
                writeln!(o, "      dlopen(\"{name}\") [{rule}]: not found")
            }
            OpenOutcome::Failed { error } => {
                writeln!(o, "      dlopen(\"{name}\") [{rule}]: FAILED: {error}")
            }
        };
        if let Some(l) = &op.located {
            let _ = writeln!(o, "        the file exists: {} (via {})", l.path, l.via);
        }
    }
    if let Some(f) = &step.file {
        for line in f.lines("      ") {
            let _ = writeln!(o, "{line}");
        }
    }
    if let Some(h) = &step.hint {
        let _ = writeln!(o, "      hint: {h}");
    }
    if a.builtin && a.label.starts_with("built-in") && !a.label.contains("cost model") {
        let _ = writeln!(
            o,
            "      (NCCL itself would try its internal IB, then Socket transports here)"
        );
    }
    let _ = match &a.outcome {
        Outcome::Selected(c) => writeln!(
            o,
            "      -> selected '{}' ({})",
            c.name,
            if c.symbol.is_empty() {
                "built in"
            } else {
                &c.symbol
            }
        ),
        Outcome::Failed(e) => writeln!(o, "      -> FAILED: {}", e.reason()),
        Outcome::Skipped(e) => writeln!(o, "      -> skipped: {}", e.reason()),
    };
}
