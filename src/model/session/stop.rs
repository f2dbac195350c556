//! Stop strings: text that may still become one is held back until it cannot.

/// Withholds text that might be the start of a stop string until it is clear that it is not.
pub(crate) struct StopFilter {
    stops: Vec<String>,
    pending: String,
}

impl StopFilter {
    pub(crate) fn new(stops: &[String]) -> StopFilter {
        StopFilter {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Adds text; returns what can be shown now and the stop string, if one completed.
    pub(crate) fn push(&mut self, piece: &str) -> (String, Option<String>) {
        self.pending.push_str(piece);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.pending), None);
        }
        if let Some((at, s)) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|i| (i, s.clone())))
            .min_by_key(|(i, _)| *i)
        {
            let emit = self.pending[..at].to_string();
            self.pending.clear();
            return (emit, Some(s));
        }
        // Keep the longest tail that is a prefix of some stop string.
        let keep = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let emit = self.pending[..keep].to_string();
        self.pending.drain(..keep);
        (emit, None)
    }

    pub(crate) fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::StopFilter;

    #[test]
    fn stop_filter_withholds_prefixes_and_cuts_at_the_stop() {
        let mut f = StopFilter::new(&["</end>".to_string()]);
        assert_eq!(f.push("Hello <"), ("Hello ".to_string(), None));
        assert_eq!(f.push("/en"), (String::new(), None));
        assert_eq!(
            f.push("d> tail"),
            (String::new(), Some("</end>".to_string()))
        );
        let mut f = StopFilter::new(&["</end>".to_string()]);
        assert_eq!(f.push("a <b"), ("a <b".to_string(), None));
        assert_eq!(f.push("<"), (String::new(), None));
        assert_eq!(f.flush(), "<");
    }

    #[test]
    fn no_stop_strings_pass_everything() {
        let mut f = StopFilter::new(&[]);
        assert_eq!(f.push("x<"), ("x<".to_string(), None));
    }
}
