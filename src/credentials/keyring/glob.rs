//! Host label globs with Go's `filepath.Match` semantics.

/// Go's `filepath.Match` on Unix: `*` (any run of non-`/`), `?` (one
/// non-`/` character), `[...]` / `[^...]` classes with ranges, `\` escapes.
/// A malformed pattern matches nothing.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    if !valid_pattern(&p) {
        return false;
    }
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() {
            if p[pi] == '*' {
                star = Some((pi, ni));
                pi += 1;
                continue;
            }
            if let Some(len) = match_one(&p[pi..], n[ni]) {
                pi += len;
                ni += 1;
                continue;
            }
        }
        match star {
            Some((sp, sn)) if n[sn] != '/' => {
                star = Some((sp, sn + 1));
                pi = sp + 1;
                ni = sn + 1;
            }
            _ => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// One escaped or plain character of a class; `None` when malformed.
fn class_char(p: &[char], i: usize) -> Option<(char, usize)> {
    match p.get(i)? {
        '-' | ']' => None,
        '\\' => p.get(i + 1).map(|&c| (c, i + 2)),
        &c => Some((c, i + 1)),
    }
}

/// A parsed `[...]` class: negated, its inclusive ranges, the index after `]`.
type Class = (bool, Vec<(char, char)>, usize);

/// Parses a class starting after `[`.
fn parse_class(p: &[char], start: usize) -> Option<Class> {
    let mut i = start;
    let negated = p.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        if p.get(i) == Some(&']') && !ranges.is_empty() {
            return Some((negated, ranges, i + 1));
        }
        let (lo, next) = class_char(p, i)?;
        i = next;
        let mut hi = lo;
        if p.get(i) == Some(&'-') {
            let (h, next) = class_char(p, i + 1)?;
            hi = h;
            i = next;
        }
        ranges.push((lo, hi));
    }
}

fn valid_pattern(p: &[char]) -> bool {
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '\\' if i + 1 >= p.len() => return false,
            '\\' => i += 2,
            '[' => match parse_class(p, i + 1) {
                Some((_, _, next)) => i = next,
                None => return false,
            },
            _ => i += 1,
        }
    }
    true
}

/// Matches one non-`*` pattern element at the start of `p` against `c`;
/// returns the element's length in the pattern.
fn match_one(p: &[char], c: char) -> Option<usize> {
    match p.first()? {
        '?' => (c != '/').then_some(1),
        '\\' => (p.get(1)? == &c).then_some(2),
        '[' => {
            let (negated, ranges, next) = parse_class(p, 1)?;
            let inside = ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
            (inside != negated && c != '/').then_some(next)
        }
        &x => (x == c).then_some(1),
    }
}
