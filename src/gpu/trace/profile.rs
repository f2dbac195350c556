//! The profile: over the last N decode steps and the last prompt, each op family (the op of a
//! label, its layer dropped: `attn_q`, `attention`, `ffn_down`) with its calls per step, time per
//! step, share of the step's wall time, bytes, achieved GB/s and share of the device's bound;
//! the step's wall time not covered by ops is "host/launch". Fed by the collector, read by the
//! Profile panel (`ui/profile.rs`) and `bench --profile`; [`ProfileSnapshot`] is plain data.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::label::{OpCosts, parse_label};

/// Decode steps the profile keeps by default.
pub const DEFAULT_STEPS: usize = 32;

/// The name of the gap row.
pub const HOST_ROW: &str = "host/launch";

/// One op family over the steps of a table.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileRow {
    pub op: String,
    /// Launches (GPU) or calls (CPU) per step.
    pub calls: f64,
    /// Microseconds per step.
    pub us: f64,
    /// Of the step's wall time.
    pub share: f64,
    /// Bytes read and written per step (weights and KV cache read, outputs and KV written),
    /// where the model's op costs know the op.
    pub bytes: Option<u64>,
    pub gbps: Option<f64>,
    /// Achieved bandwidth as a share of the device's (the bound `bench` uses).
    pub bound: Option<f64>,
    /// Microseconds in each step, oldest first.
    pub per_step: Vec<f32>,
}

/// One table: the last decode steps, or the last prompt's batches.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileTable {
    /// `decode` or `prompt`.
    pub kind: String,
    pub steps: usize,
    pub tokens: u64,
    /// Mean wall time of a step, µs.
    pub wall_us: f64,
    /// Mean of the ops' time in a step, µs.
    pub ops_us: f64,
    /// Wall time of each step, oldest first (the sparkline).
    pub step_us: Vec<f32>,
    /// Op families, longest first, then the host/launch row.
    pub rows: Vec<ProfileRow>,
    /// What the table cannot show (kernels hidden inside replayed graphs).
    pub note: Option<String>,
}

impl ProfileTable {
    /// Tokens per second the steps' wall times give.
    pub fn tokens_per_s(&self) -> f64 {
        let secs = self.wall_us * self.steps as f64 / 1e6;
        if secs > 0.0 {
            self.tokens as f64 / secs
        } else {
            0.0
        }
    }

    /// The table as text (`bench --profile`): one line per row.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "profile of {} {} step{} ({} tokens): {:.1} µs a step, ops {:.1} µs",
            self.steps,
            self.kind,
            if self.steps == 1 { "" } else { "s" },
            self.tokens,
            self.wall_us,
            self.ops_us
        )];
        out.push(format!(
            "  {:<28} {:>7} {:>10} {:>6} {:>10} {:>8} {:>6}",
            "op", "calls", "µs/step", "share", "bytes", "GB/s", "bound"
        ));
        for r in &self.rows {
            let bytes = r.bytes.map_or("—".into(), human);
            let gbps = r.gbps.map_or("—".into(), |g| format!("{g:.1}"));
            let bound = r.bound.map_or("—".into(), |b| format!("{:.0}%", 100.0 * b));
            let calls = if r.op == HOST_ROW {
                String::new()
            } else {
                format!("{:.1}", r.calls)
            };
            out.push(format!(
                "  {:<28} {:>7} {:>10.1} {:>5.1}% {:>10} {:>8} {:>6}",
                clip(&r.op, 28),
                calls,
                r.us,
                100.0 * r.share,
                bytes,
                gbps,
                bound
            ));
        }
        if let Some(n) = &self.note {
            out.push(format!("  note: {n}"));
        }
        out
    }
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// `1.2 MB`: decimal units, as GB/s are.
pub fn human(b: u64) -> String {
    let v = b as f64;
    if v >= 1e9 {
        format!("{:.2} GB", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.1} MB", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} kB", v / 1e3)
    } else {
        format!("{b} B")
    }
}

/// What the profile shows: the two tables and what they were measured against.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileSnapshot {
    pub decode: Option<ProfileTable>,
    pub prompt: Option<ProfileTable>,
    /// The device's bandwidth the bound column divides by, bytes/s.
    pub bandwidth: Option<f64>,
    /// Events the ring dropped (the collector fell behind).
    pub dropped: u64,
}

#[derive(Clone, Debug, Default)]
struct Family {
    calls: u64,
    ns: u64,
    /// The (layer, op) of every call, for its bytes (each counted once a step).
    keys: BTreeSet<(Option<u32>, String)>,
}

#[derive(Clone, Debug, Default)]
struct StepAcc {
    id: u32,
    ended: bool,
    pos0: u64,
    tokens: u64,
    wall_ns: u64,
    families: BTreeMap<String, Family>,
    graph_kernels: usize,
}

impl StepAcc {
    fn decode(&self) -> bool {
        self.tokens == 1
    }
}

/// Accumulates steps; a pure function of what it was fed.
#[derive(Debug)]
pub struct Profiler {
    keep: usize,
    /// Steps with ops or an end, newest last.
    steps: VecDeque<StepAcc>,
    /// The last prompt's batches (replaced when a new prompt starts).
    prompt: Vec<StepAcc>,
}

impl Default for Profiler {
    fn default() -> Self {
        Profiler::new(DEFAULT_STEPS)
    }
}

impl Profiler {
    pub fn new(keep: usize) -> Profiler {
        Profiler {
            keep: keep.max(1),
            steps: VecDeque::new(),
            prompt: Vec::new(),
        }
    }

    /// Forgets every step (`bench` between tests).
    pub fn reset(&mut self) {
        self.steps.clear();
        self.prompt.clear();
    }

    fn step_mut(&mut self, id: u32) -> Option<&mut StepAcc> {
        if id == 0 {
            return None;
        }
        if let Some(i) = self.steps.iter().position(|s| s.id == id) {
            return Some(&mut self.steps[i]);
        }
        if let Some(i) = self.prompt.iter().position(|s| s.id == id) {
            return Some(&mut self.prompt[i]);
        }
        // Older than everything kept: too late to count.
        if self.steps.front().is_some_and(|f| id < f.id) {
            return None;
        }
        self.steps.push_back(StepAcc {
            id,
            ..StepAcc::default()
        });
        // Keep the decode steps asked for, plus the batches of a prompt being run.
        let cap = self.keep * 2 + 64;
        while self.steps.len() > cap {
            self.steps.pop_front();
        }
        self.steps.back_mut()
    }

    /// An op of step `step` that took `ns`, labelled `label`; a replayed graph brings the labels
    /// of the kernels inside it (`nodes`), whose times it hides.
    pub fn op(&mut self, step: u32, label: &str, ns: u64, nodes: Option<&[String]>) {
        let Some(s) = self.step_mut(step) else {
            return;
        };
        let p = parse_label(label);
        let (family, keys) = match nodes {
            Some(nodes) => {
                s.graph_kernels = nodes.len();
                let keys = nodes
                    .iter()
                    .map(|n| {
                        let q = parse_label(n);
                        (q.layer, q.op.to_string())
                    })
                    .collect::<Vec<_>>();
                (format!("graph replay ({} kernels)", nodes.len()), keys)
            }
            None => (p.op.to_string(), vec![(p.layer, p.op.to_string())]),
        };
        let f = s.families.entry(family).or_default();
        f.calls += 1;
        f.ns += ns;
        f.keys.extend(keys);
    }

    /// Step `id` ended: it ran `tokens` tokens from `pos0` in `wall_ns`.
    pub fn step_end(&mut self, id: u32, pos0: u64, tokens: u64, wall_ns: u64) {
        let Some(s) = self.step_mut(id) else {
            return;
        };
        s.ended = true;
        s.pos0 = pos0;
        s.tokens = tokens;
        s.wall_ns = wall_ns;
        if tokens > 1 {
            // A prompt batch: it joins the prompt being run, or starts a new one (a batch that
            // does not continue the last one's positions).
            let Some(i) = self.steps.iter().position(|s| s.id == id) else {
                return;
            };
            let Some(s) = self.steps.remove(i) else {
                return;
            };
            let continues = self
                .prompt
                .last()
                .is_some_and(|l| l.pos0 + l.tokens == s.pos0 && l.id < s.id);
            let newer_decode = self
                .steps
                .iter()
                .any(|d| d.ended && d.decode() && self.prompt.last().is_some_and(|l| d.id > l.id));
            if !continues || newer_decode {
                self.prompt.clear();
            }
            self.prompt.push(s);
        }
    }

    /// The tables as they stand; `costs` gives bytes, `bandwidth` (bytes/s) the bound.
    pub fn snapshot(&self, costs: &OpCosts, bandwidth: Option<f64>) -> ProfileSnapshot {
        let decode: Vec<&StepAcc> = {
            let ended: Vec<&StepAcc> = self
                .steps
                .iter()
                .filter(|s| s.ended && s.decode())
                .collect();
            let from = ended.len().saturating_sub(self.keep);
            ended[from..].to_vec()
        };
        let prompt: Vec<&StepAcc> = self.prompt.iter().filter(|s| s.ended).collect();
        ProfileSnapshot {
            decode: table("decode", &decode, costs, bandwidth),
            prompt: table("prompt", &prompt, costs, bandwidth),
            bandwidth,
            dropped: 0,
        }
    }
}

fn table(
    kind: &str,
    steps: &[&StepAcc],
    costs: &OpCosts,
    bandwidth: Option<f64>,
) -> Option<ProfileTable> {
    if steps.is_empty() {
        return None;
    }
    let n = steps.len() as f64;
    let wall_ns: u64 = steps.iter().map(|s| s.wall_ns).sum();
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for s in steps {
        names.extend(s.families.keys().map(|k| k.as_str()));
    }
    let mut rows = Vec::new();
    let mut ops_ns = 0u64;
    for name in names {
        let (mut calls, mut ns) = (0u64, 0u64);
        let mut bytes = Some(0u64);
        let mut per_step = Vec::with_capacity(steps.len());
        for s in steps {
            let Some(f) = s.families.get(name) else {
                per_step.push(0.0);
                continue;
            };
            calls += f.calls;
            ns += f.ns;
            per_step.push(f.ns as f32 / 1e3);
            for (layer, op) in &f.keys {
                bytes = match (bytes, costs.get(*layer, op)) {
                    (Some(b), Some(c)) => {
                        let (r, w) = c.bytes(s.pos0, s.tokens);
                        Some(b + r + w)
                    }
                    _ => None,
                };
            }
        }
        ops_ns += ns;
        let bytes = bytes
            .filter(|&b| b > 0)
            .map(|b| (b as f64 / n).round() as u64);
        let us = ns as f64 / 1e3 / n;
        let gbps = bytes.filter(|_| us > 0.0).map(|b| b as f64 / (us * 1e3));
        rows.push(ProfileRow {
            op: name.to_string(),
            calls: calls as f64 / n,
            us,
            share: if wall_ns > 0 {
                ns as f64 / wall_ns as f64
            } else {
                0.0
            },
            bytes,
            gbps,
            bound: gbps.zip(bandwidth).map(|(g, bw)| g * 1e9 / bw),
            per_step,
        });
    }
    rows.sort_by(|a, b| b.us.total_cmp(&a.us).then_with(|| a.op.cmp(&b.op)));
    let gap_ns = wall_ns.saturating_sub(ops_ns);
    rows.push(ProfileRow {
        op: HOST_ROW.into(),
        calls: 0.0,
        us: gap_ns as f64 / 1e3 / n,
        share: if wall_ns > 0 {
            gap_ns as f64 / wall_ns as f64
        } else {
            0.0
        },
        bytes: None,
        gbps: None,
        bound: None,
        per_step: steps
            .iter()
            .map(|s| {
                let ops: u64 = s.families.values().map(|f| f.ns).sum();
                s.wall_ns.saturating_sub(ops) as f32 / 1e3
            })
            .collect(),
    });
    let graph = steps.iter().map(|s| s.graph_kernels).max().unwrap_or(0);
    Some(ProfileTable {
        kind: kind.to_string(),
        steps: steps.len(),
        tokens: steps.iter().map(|s| s.tokens).sum(),
        wall_us: wall_ns as f64 / 1e3 / n,
        ops_us: ops_ns as f64 / 1e3 / n,
        step_us: steps.iter().map(|s| s.wall_ns as f32 / 1e3).collect(),
        rows,
        note: (graph > 0).then(|| {
            format!(
                "a replayed graph runs its {graph} kernels as one op and hides their times; \
                 --no-graphs (or graphs = false) times each"
            )
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::trace::label::OpCost;

    fn costs() -> OpCosts {
        let mut c = OpCosts::default();
        for l in 0..2 {
            c.insert(
                Some(l),
                "attn_q",
                OpCost {
                    read: 1000,
                    written_per_token: 0,
                    ..OpCost::default()
                },
            );
            c.insert(
                Some(l),
                "attention",
                OpCost {
                    read_per_position: 10,
                    ..OpCost::default()
                },
            );
        }
        c
    }

    #[test]
    fn families_sum_over_layers_and_the_gap_is_host_time() {
        let mut p = Profiler::new(4);
        for step in 1..=3u32 {
            for l in 0..2 {
                p.op(step, &format!("layer {l} · attn_q · mv"), 2_000, None);
                p.op(step, &format!("layer {l} · attention"), 1_000, None);
            }
            // Positions 9 + step: attention reads 10 + step positions.
            p.step_end(step, 9 + step as u64, 1, 10_000);
        }
        let snap = p.snapshot(&costs(), Some(1e9));
        let t = snap.decode.expect("decode table");
        assert_eq!(t.steps, 3);
        assert!(snap.prompt.is_none());
        let q = &t.rows[0];
        assert_eq!(q.op, "attn_q");
        assert_eq!(q.calls, 2.0);
        assert_eq!(q.us, 4.0);
        assert!((q.share - 0.4).abs() < 1e-9);
        assert_eq!(q.bytes, Some(2000));
        // 2000 bytes in 4 µs: 0.5 GB/s, half of the 1 GB/s bound.
        assert!((q.gbps.unwrap() - 0.5).abs() < 1e-9);
        assert!((q.bound.unwrap() - 0.5).abs() < 1e-9);
        let a = &t.rows[1];
        assert_eq!(a.op, "attention");
        // Steps at 10, 11, 12 read 11, 12, 13 positions × 10 bytes × 2 layers: mean 240.
        assert_eq!(a.bytes, Some(240));
        let gap = t.rows.last().unwrap();
        assert_eq!(gap.op, HOST_ROW);
        assert_eq!(gap.us, 4.0);
        assert_eq!(gap.per_step, vec![4.0, 4.0, 4.0]);
        assert_eq!(t.step_us, vec![10.0, 10.0, 10.0]);
        assert!(t.lines().iter().any(|l| l.contains("attn_q")));
    }

    #[test]
    fn the_last_n_decode_steps_and_the_last_prompt_are_kept() {
        let mut p = Profiler::new(2);
        // A prompt of two batches, three decode steps, then a new prompt of one batch.
        p.op(1, "layer 0 · attn_q", 5_000, None);
        p.step_end(1, 0, 8, 6_000);
        p.op(2, "layer 0 · attn_q", 5_000, None);
        p.step_end(2, 8, 8, 6_000);
        for s in 3..=5 {
            p.op(s, "layer 0 · attn_q", 1_000, None);
            p.step_end(s, 16 + s as u64 - 3, 1, 2_000);
        }
        let t = p.snapshot(&OpCosts::default(), None);
        assert_eq!(t.decode.as_ref().map(|d| d.steps), Some(2));
        let pr = t.prompt.expect("prompt");
        assert_eq!((pr.steps, pr.tokens), (2, 16));
        // Unknown bytes stay unknown rather than zero.
        assert_eq!(pr.rows[0].bytes, None);
        p.op(6, "layer 0 · attn_q", 5_000, None);
        p.step_end(6, 19, 4, 6_000);
        let pr = p
            .snapshot(&OpCosts::default(), None)
            .prompt
            .expect("prompt");
        assert_eq!((pr.steps, pr.tokens), (1, 4));
    }

    #[test]
    fn a_graph_replay_is_one_row_with_its_kernels_bytes_and_a_note() {
        let mut p = Profiler::new(4);
        let nodes = vec![
            "layer 0 · attn_q · mv".to_string(),
            "layer 1 · attn_q · mv".to_string(),
            "layer 0 · attention · attn".to_string(),
        ];
        p.op(1, "decode step · graph", 8_000, Some(&nodes));
        p.step_end(1, 0, 1, 10_000);
        let t = p.snapshot(&costs(), None).decode.expect("decode");
        assert_eq!(t.rows[0].op, "graph replay (3 kernels)");
        // Two attn_q weights and one layer's attention over one position.
        assert_eq!(t.rows[0].bytes, Some(2010));
        assert!(t.note.as_deref().is_some_and(|n| n.contains("--no-graphs")));
    }

    #[test]
    fn ops_of_forgotten_steps_are_ignored() {
        let mut p = Profiler::new(1);
        for s in 1..=200u32 {
            p.op(s, "x", 1, None);
            p.step_end(s, s as u64, 1, 2);
        }
        p.op(1, "late", 1, None);
        let t = p
            .snapshot(&OpCosts::default(), None)
            .decode
            .expect("decode");
        assert_eq!(t.steps, 1);
        assert!(t.rows.iter().all(|r| r.op != "late"));
    }
}
