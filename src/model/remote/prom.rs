//! The Prometheus text exposition format (version 0.0.4), as llama-server (`--metrics`) and vLLM
//! serve it on `/metrics`: samples by name and labels, and histograms put back together.
//!
//! Own code rather than a crate: `prometheus-parse` (the one text-format parser on crates.io that
//! is not part of a client library) brings `chrono`, `regex` and `lazy_static`, and keeps going
//! past lines it cannot read; here a page that is not metrics must be refused with the line that
//! is wrong. Fuzzed by `fuzz/fuzz_targets/metrics_parser.rs` and property-tested below.

use std::fmt::Write;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A parsed page.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

/// A histogram's totals (over every label set that is not `le`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub count: f64,
    pub sum: f64,
    /// Upper bound, cumulative count; sorted by bound.
    pub buckets: Vec<(f64, f64)>,
}

impl Histogram {
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PromError {
    #[error("line {line} is not a Prometheus sample: {why} (`{text}`)")]
    Line {
        line: usize,
        why: &'static str,
        text: String,
    },
    #[error("the page holds no metrics")]
    Empty,
}

/// The most of a bad line quoted in an error.
const QUOTE: usize = 80;

impl Metrics {
    pub fn parse(text: &str) -> Result<Metrics, PromError> {
        let mut samples = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let s = sample(line).map_err(|why| PromError::Line {
                line: i + 1,
                why,
                text: quote(line),
            })?;
            samples.push(s);
        }
        if samples.is_empty() && !text.lines().any(|l| l.starts_with("# TYPE")) {
            return Err(PromError::Empty);
        }
        Ok(Metrics { samples })
    }

    /// The sum over every label set of `name` (a gauge per model or per engine adds up);
    /// `None` if the page has no such sample.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut found = false;
        let mut total = 0.0;
        for s in self.samples.iter().filter(|s| s.name == name) {
            found = true;
            total += s.value;
        }
        found.then_some(total)
    }

    /// The mean over label sets of `name` (a ratio per engine).
    pub fn mean(&self, name: &str) -> Option<f64> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// The histogram `base` (`base_bucket`, `base_sum`, `base_count`), summed over label sets.
    pub fn histogram(&self, base: &str) -> Option<Histogram> {
        let count = self.sum(&format!("{base}_count"))?;
        let sum = self.sum(&format!("{base}_sum")).unwrap_or(0.0);
        let bucket = format!("{base}_bucket");
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for s in self.samples.iter().filter(|s| s.name == bucket) {
            let Some(le) = s
                .labels
                .iter()
                .find(|(k, _)| k == "le")
                .and_then(|(_, v)| parse_value(v))
            else {
                continue;
            };
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some(b) => b.1 += s.value,
                None => buckets.push((le, s.value)),
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Histogram {
            count,
            sum,
            buckets,
        })
    }
}

fn quote(line: &str) -> String {
    let mut q = String::new();
    for (n, c) in line.chars().enumerate() {
        if n == QUOTE {
            q.push('…');
            break;
        }
        if c.is_control() {
            let _ = write!(q, "\\u{{{:x}}}", c as u32);
        } else {
            q.push(c);
        }
    }
    q
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || c.is_ascii_digit()
}

fn sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line
        .char_indices()
        .find(|&(_, c)| !is_name_char(c))
        .map(|(i, _)| i)
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if !name.starts_with(is_name_start) {
        return Err("it does not start with a metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start();
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let k_end = rest
                .char_indices()
                .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_'))
                .map(|(i, _)| i)
                .ok_or("a label set is not closed")?;
            let key = &rest[..k_end];
            if key.is_empty() {
                return Err("a label has no name");
            }
            rest = rest[k_end..]
                .trim_start()
                .strip_prefix('=')
                .ok_or("a label has no `=`")?
                .trim_start()
                .strip_prefix('"')
                .ok_or("a label value is not quoted")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err("a label value is not closed"),
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => return Err("a label value is not closed"),
                    },
                    Some((_, c)) => value.push(c),
                }
            };
            labels.push((key.to_string(), value));
            rest = rest[end + 1..].trim_start();
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else if !rest.starts_with('}') {
                return Err("labels are not separated by commas");
            }
        }
    }
    let mut parts = rest.split_whitespace();
    let value = parts
        .next()
        .ok_or("it has no value")
        .and_then(|v| parse_value(v).ok_or("its value is not a number"))?;
    if let Some(ts) = parts.next()
        && ts.parse::<i64>().is_err()
    {
        return Err("its timestamp is not a whole number");
    }
    if parts.next().is_some() {
        return Err("there is text after the value and timestamp");
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse::<f64>().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn labels_escapes_timestamps_and_histograms() {
        let page = "# HELP x_seconds time\n# TYPE x_seconds histogram\n\
            x_seconds_bucket{model_name=\"a\\\"b\",le=\"0.1\"} 2\n\
            x_seconds_bucket{model_name=\"a\\\"b\",le=\"+Inf\"} 3 1700000000000\n\
            x_seconds_sum{model_name=\"a\\\"b\"} 0.6\nx_seconds_count{model_name=\"a\\\"b\"} 3\n\
            up 1\n";
        let m = Metrics::parse(page).unwrap();
        assert_eq!(m.samples[0].labels[0], ("model_name".into(), "a\"b".into()));
        let h = m.histogram("x_seconds").unwrap();
        assert_eq!(h.count, 3.0);
        assert!((h.mean().unwrap() - 0.2).abs() < 1e-9);
        assert_eq!(h.buckets, vec![(0.1, 2.0), (f64::INFINITY, 3.0)]);
        assert_eq!(m.sum("up"), Some(1.0));
        assert_eq!(m.sum("down"), None);
    }

    #[test]
    fn garbage_is_refused_naming_the_line() {
        let e = Metrics::parse("<html>\n<body>Not Found</body>").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1 is not a Prometheus sample: it does not start with a metric name (`<html>`)"
        );
        let e = Metrics::parse("ok 1\nbad{le=\"1} 2\n").unwrap_err();
        assert!(e.to_string().starts_with("line 2 "), "{e}");
        assert_eq!(Metrics::parse(""), Err(PromError::Empty));
        assert!(Metrics::parse("x one").is_err());
    }

    proptest! {
        /// Any text: metrics or an error, never a panic.
        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,200}") {
            let _ = Metrics::parse(&s);
        }

        /// A sample written out is read back.
        #[test]
        fn written_samples_read_back(name in "[a-z_:][a-z0-9_:]{0,12}",
                                     label in "[a-z_]{1,8}", value in "[ -~]{0,12}",
                                     v in -1e9f64..1e9) {
            let esc = value.replace('\\', "\\\\").replace('"', "\\\"");
            let page = format!("{name}{{{label}=\"{esc}\"}} {v}\n");
            let m = Metrics::parse(&page).unwrap();
            prop_assert_eq!(&m.samples[0].name, &name);
            prop_assert_eq!(&m.samples[0].labels[0].1, &value);
            prop_assert_eq!(m.samples[0].value, v);
        }
    }
}
