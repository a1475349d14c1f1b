//! Wildcard values (`value: "a*b*c"`): each `*` matches any run of characters, empty included,
//! as envoyproxy/ratelimit matches them.

/// A rule value with at least one `*`, split once at load time so that matching allocates
/// nothing.
///
/// ```
/// use flowgate::envoy::Wildcard;
/// let w = Wildcard::new("/api/*/resource/*/action").unwrap();
/// assert!(w.matches("/api/v1/resource/123/action"));
/// assert!(w.matches("/api//resource//action"));
/// assert!(!w.matches("/api/v1/resource/123/other"));
/// assert!(Wildcard::new("exact").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    /// The pattern as written.
    pattern: String,
    /// Byte index of the first `*`.
    first: usize,
    /// Byte index of the last `*` (the same as `first` when there is one).
    last: usize,
    /// The number of literal bytes: how specific the pattern is.
    literal_len: usize,
}

impl Wildcard {
    /// The pattern for `value`, or `None` when it has no `*` (an exact value).
    pub fn new(value: &str) -> Option<Wildcard> {
        let first = value.find('*')?;
        let last = value.rfind('*')?;
        let literal_len = value.len() - value.matches('*').count();
        Some(Wildcard {
            pattern: value.to_owned(),
            first,
            last,
            literal_len,
        })
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The number of literal (non-`*`) bytes: among several matching patterns, the one with
    /// the most wins (for trailing `*` patterns: the longest prefix).
    pub fn literal_len(&self) -> usize {
        self.literal_len
    }

    /// Whether `value` matches: it starts with the part before the first `*`, ends with the
    /// part after the last, and holds the parts in between in order, without overlap, between
    /// those two. Allocates nothing.
    #[inline]
    pub fn matches(&self, value: &str) -> bool {
        let (pattern, bytes) = (self.pattern.as_bytes(), value.as_bytes());
        // Cheap rejections first, inline: too short, or the first byte differs (the usual
        // miss when a key has several wildcard rules).
        if bytes.len() < self.literal_len || (self.first > 0 && bytes.first() != pattern.first()) {
            return false;
        }
        self.matches_parts(value)
    }

    /// [`matches`](Wildcard::matches) past its quick rejections.
    fn matches_parts(&self, value: &str) -> bool {
        let prefix = &self.pattern[..self.first];
        let suffix = &self.pattern[self.last + 1..];
        let Some(rest) = value.strip_prefix(prefix) else {
            return false;
        };
        let Some(mut between) = rest.strip_suffix(suffix) else {
            return false;
        };
        if self.first == self.last {
            return true;
        }
        // Leftmost placement of each middle part leaves the most room for the next ones.
        for part in self.pattern[self.first + 1..self.last].split('*') {
            match between.find(part) {
                Some(at) => between = &between[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A reference matcher by plain recursion, no cleverness: `*` consumes 0..=n characters.
    fn reference(pattern: &[char], value: &[char]) -> bool {
        match pattern.split_first() {
            None => value.is_empty(),
            Some(('*', rest)) => (0..=value.len()).any(|skip| reference(rest, &value[skip..])),
            Some((c, rest)) => value.first() == Some(c) && reference(rest, &value[1..]),
        }
    }

    fn both(pattern: &str, value: &str) -> (bool, bool) {
        let p: Vec<char> = pattern.chars().collect();
        let v: Vec<char> = value.chars().collect();
        (
            Wildcard::new(pattern).unwrap().matches(value),
            reference(&p, &v),
        )
    }

    #[test]
    fn the_readme_examples() {
        let trailing = Wildcard::new("value*").unwrap();
        for v in ["value1", "value2", "valueXYZ", "value"] {
            assert!(trailing.matches(v), "{v}");
        }
        assert!(!trailing.matches("valu"));
        let middle = Wildcard::new("/api/*/action").unwrap();
        assert!(middle.matches("/api/123/action"));
        assert!(middle.matches("/api/user-id/action"));
        assert!(!middle.matches("/api/123/other"));
        let multi = Wildcard::new("/api/*/resource/*/action").unwrap();
        assert!(multi.matches("/api/v1/resource/123/action"));
        assert!(multi.matches("/api/v2/resource/456/action"));
        assert!(!multi.matches("/api/v2/resource/456"));
    }

    #[test]
    fn parts_do_not_overlap() {
        // "ab" as prefix and "ba" as suffix need 4 characters, not 3.
        assert_eq!(both("ab*ba", "aba"), (false, false));
        assert_eq!(both("ab*ba", "abba"), (true, true));
        assert_eq!(both("a*a*a", "aa"), (false, false));
        assert_eq!(both("a*a*a", "aaa"), (true, true));
        assert_eq!(both("*", ""), (true, true));
        assert_eq!(both("**", "x"), (true, true));
        assert_eq!(both("a*b*c", "a_b_b_c"), (true, true));
        assert_eq!(both("a*b*c", "acb"), (false, false));
        assert_eq!(both("é*ü", "éü"), (true, true));
    }

    #[test]
    fn literal_len_orders_specificity() {
        assert_eq!(Wildcard::new("/api/*").unwrap().literal_len(), 5);
        assert_eq!(Wildcard::new("/api/*/x").unwrap().literal_len(), 7);
        assert_eq!(Wildcard::new("*").unwrap().literal_len(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, rng_seed: proptest::test_runner::RngSeed::Fixed(23), ..ProptestConfig::default() })]
        /// Any pattern over a small alphabet agrees with the reference matcher on any value.
        #[test]
        fn agrees_with_the_reference(pattern in "[ab*é]{0,8}", value in "[abé]{0,10}") {
            prop_assume!(pattern.contains('*'));
            let (fast, slow) = both(&pattern, &value);
            prop_assert_eq!(fast, slow, "pattern {:?} value {:?}", pattern, value);
        }

        /// A value built by filling every `*` of a pattern matches it.
        #[test]
        fn filled_patterns_match(pattern in "[ab*]{1,8}", fills in proptest::collection::vec("[ab]{0,3}", 8)) {
            prop_assume!(pattern.contains('*'));
            let mut value = String::new();
            for (i, part) in pattern.split('*').enumerate() {
                if i > 0 {
                    value.push_str(&fills[i - 1]);
                }
                value.push_str(part);
            }
            prop_assert!(Wildcard::new(&pattern).unwrap().matches(&value));
        }
    }
}
