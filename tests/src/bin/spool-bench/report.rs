//! Figures, their same-run baselines and ratios, written as JSON and as a Markdown table.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// One measured figure of a scenario.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Figure {
    pub(crate) scenario: String,
    pub(crate) metric: String,
    pub(crate) unit: String,
    /// The median over rounds.
    pub(crate) value: f64,
    /// Each round's value.
    pub(crate) rounds: Vec<f64>,
    pub(crate) baseline: Option<Baseline>,
    /// The target, as text (`≥ 0.8× baseline`, `≤ 5 ms`).
    pub(crate) target: Option<String>,
    /// Whether the target is met.
    pub(crate) met: Option<bool>,
}

/// What a figure is compared with, measured in the same run.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Baseline {
    pub(crate) name: String,
    pub(crate) value: f64,
    pub(crate) rounds: Vec<f64>,
    /// value / baseline value (medians).
    pub(crate) ratio: f64,
}

/// Notes of a scenario: its setup and its CPU split.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Note {
    pub(crate) scenario: String,
    pub(crate) text: String,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) machine: String,
    pub(crate) mode: String,
    pub(crate) figures: Vec<Figure>,
    pub(crate) notes: Vec<Note>,
}

/// The median of `values` (0 if empty).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A latency histogram in microseconds, 1 µs to 10 min, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).expect("hdr"))
}

/// A quantile of a µs histogram, in milliseconds.
pub(crate) fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

impl Figure {
    pub(crate) fn new(scenario: &str, metric: &str, unit: &str, rounds: Vec<f64>) -> Self {
        Self {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            unit: unit.to_owned(),
            value: median(&rounds),
            rounds,
            baseline: None,
            target: None,
            met: None,
        }
    }

    /// Compares with a baseline; `min_ratio` is the target ratio, if the issue sets one.
    pub(crate) fn against(mut self, name: &str, rounds: Vec<f64>, min_ratio: Option<f64>) -> Self {
        let value = median(&rounds);
        let ratio = if value > 0.0 { self.value / value } else { 0.0 };
        self.baseline = Some(Baseline {
            name: name.to_owned(),
            value,
            rounds,
            ratio,
        });
        if let Some(min) = min_ratio {
            self.target = Some(format!("≥ {min}× baseline"));
            self.met = Some(ratio >= min);
        }
        self
    }

    /// Compares with a baseline where less is better (a latency, a duration); `max_ratio` is
    /// the target.
    pub(crate) fn at_most_times(self, name: &str, rounds: Vec<f64>, max_ratio: f64) -> Self {
        let mut figure = self.against(name, rounds, None);
        let ratio = (figure.baseline.as_ref())
            .filter(|b| b.value > 0.0)
            .map_or(f64::INFINITY, |b| b.ratio);
        figure.target = Some(format!("≤ {max_ratio}× baseline"));
        figure.met = Some(ratio <= max_ratio);
        figure
    }

    /// An absolute upper bound.
    pub(crate) fn at_most(mut self, limit: f64) -> Self {
        self.target = Some(format!("≤ {limit} {}", self.unit));
        self.met = Some(self.value <= limit);
        self
    }
}

fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl Report {
    pub(crate) fn note(&mut self, scenario: &str, text: impl Into<String>) {
        let text = text.into();
        eprintln!("  [{scenario}] {text}");
        self.notes.push(Note {
            scenario: scenario.to_owned(),
            text,
        });
    }

    pub(crate) fn add(&mut self, figure: Figure) {
        eprintln!("  {}", row(&figure));
        self.figures.push(figure);
    }

    pub(crate) fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Machine: {}  \nMode: {}\n", self.machine, self.mode);
        let _ = writeln!(
            out,
            "| Scenario | Metric | Spool (median) | Rounds | Baseline (median) | Ratio | Target | Met |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for f in &self.figures {
            let _ = writeln!(out, "{}", row(f));
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "\nNotes and CPU split (where the time went):\n");
            for n in &self.notes {
                let _ = writeln!(out, "- **{}**: {}", n.scenario, n.text);
            }
        }
        out
    }
}

fn row(f: &Figure) -> String {
    let rounds = f
        .rounds
        .iter()
        .map(|v| num(*v))
        .collect::<Vec<_>>()
        .join(" / ");
    let (baseline, ratio) = match &f.baseline {
        Some(b) => (
            format!("{}: {} {}", b.name, num(b.value), f.unit),
            format!("{:.2}×", b.ratio),
        ),
        None => ("–".to_owned(), "–".to_owned()),
    };
    format!(
        "| {} | {} | {} {} | {} | {} | {} | {} | {} |",
        f.scenario,
        f.metric,
        num(f.value),
        f.unit,
        rounds,
        baseline,
        ratio,
        f.target.as_deref().unwrap_or("–"),
        match f.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "–",
        }
    )
}
