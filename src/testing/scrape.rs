//! A small parser of the Prometheus/OpenMetrics text format, for tests that
//! scrape [`Metrics::encode`](crate::metrics::Metrics::encode) or `/metrics`
//! and assert values.

use std::collections::BTreeMap;

/// One sample: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Full sample name (`imaged_pulls_in_flight`, `..._bucket`, `..._total`).
    pub name: String,
    /// Labels, sorted by name.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed scrape.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Every sample, in order.
    pub samples: Vec<Sample>,
    /// `# TYPE` lines: family name → type.
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    /// Parses `text`; a malformed line is an error naming it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut s = Scrape::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').ok_or_else(|| format!("bad TYPE line: {line}"))?;
                s.types.insert(name.to_string(), ty.to_string());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            s.samples.push(parse_sample(line)?);
        }
        Ok(s)
    }

    /// The value of the one sample `name` whose labels include every pair
    /// of `labels`; `None` when none or several match.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = self
            .samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v)));
        let first = found.next()?;
        if found.next().is_some() {
            return None;
        }
        Some(first.value)
    }

    /// Every sample `name` as (its `label` value, value), sorted by the
    /// label value (a sample without the label shows an empty value).
    pub fn by_label(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| (s.labels.get(label).cloned().unwrap_or_default(), s.value))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The sum of every sample `name` whose labels include `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v)))
            .map(|s| s.value)
            .sum()
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let bad = || format!("bad sample line: {line}");
    let (name, rest) = match line.find('{') {
        Some(i) => (&line[..i], &line[i..]),
        None => line.split_once(' ').map(|(n, _)| (n, &line[n.len()..])).ok_or_else(bad)?,
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest;
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        let mut key = String::new();
        while let Some((i, c)) = chars.next() {
            match c {
                '}' => {
                    end = Some(i);
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next().map(|(_, c)| c) != Some('"') {
                        return Err(bad());
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next().ok_or_else(bad)?.1 {
                            '\\' => match chars.next().ok_or_else(bad)?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            '"' => break,
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        }
        let end = end.ok_or_else(bad)?;
        rest = &body[end + 1..];
    }
    let value_text = rest.split_whitespace().next().ok_or_else(bad)?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().map_err(|_| bad())?,
    };
    Ok(Sample { name: name.to_string(), labels, value })
}
