//! Errors of recipes and schedules: one-line messages that say what to
//! write, plus where in the input they lie, so the macro can put its caret
//! there and the runtime its `file:line:column`.

use std::fmt;

/// Which part of a written recipe, `name(key = value, ...)`, is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// The recipe as a whole (or a lone value, such as a scale-mode name).
    Whole,
    /// The recipe name.
    Name,
    /// The key of option `i`, counted as the options were given.
    Key(usize),
    /// The value of option `i`.
    Value(usize),
}

/// A recipe that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecipeError {
    /// The part of the written recipe at fault, for the caret or position.
    pub at: At,
    /// One line saying what is wrong and what to write instead.
    pub message: String,
}

impl RecipeError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        RecipeError {
            at: At::Whole,
            message: message.into(),
        }
    }

    pub(crate) fn at(mut self, at: At) -> Self {
        self.at = at;
        self
    }
}

impl fmt::Display for RecipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RecipeError {}

/// A schedule that breaks a rule, with the key path of the value at fault
/// (`phases[1].options.fprop`, `order`, `phases`), which the runtime turns
/// into a position in the RON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleError {
    /// Key path of the value at fault, e.g. `phases[1].options.fprop`.
    pub path: String,
    /// One line saying which rule is broken and how to fix it.
    pub message: String,
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for ScheduleError {}

/// The closest candidate to a misspelt `word`, if one is close enough to be
/// what was meant (edit distance at most 2 and less than the word's length).
pub fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|&(d, _)| d <= 2 && d < word.chars().count())
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance (insertions, deletions, substitutions), one row at a time.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// An enum of the table that is spelled by name.
pub(crate) trait Named: Copy + 'static {
    /// How messages call one of these ("recipe", "scale mode").
    const WHAT: &'static str;
    fn all() -> &'static [Self];
    fn name(self) -> &'static str;
}

/// `impl Named` for an enum with an `ALL` array and a `name` method.
macro_rules! named {
    ($t:ty, $what:literal) => {
        impl $crate::error::Named for $t {
            const WHAT: &'static str = $what;
            fn all() -> &'static [$t] {
                &<$t>::ALL
            }
            fn name(self) -> &'static str {
                <$t>::name(self)
            }
        }
    };
}
pub(crate) use named;

/// The value spelled `name`, if any.
pub(crate) fn find<T: Named>(name: &str) -> Option<T> {
    T::all().iter().copied().find(|t| t.name() == name)
}

/// The value spelled `name`, or an error that suggests the closest
/// spelling or lists them all.
pub(crate) fn lookup<T: Named>(name: &str) -> Result<T, RecipeError> {
    find(name).ok_or_else(|| {
        let names: Vec<&str> = T::all().iter().map(|t| t.name()).collect();
        let what = T::WHAT;
        RecipeError::new(match suggest(name, names.iter().copied()) {
            Some(near) => format!("unknown {what} `{name}`; did you mean `{near}`?"),
            None if names.len() == 2 => {
                format!(
                    "unknown {what} `{name}`; expected {} or {}",
                    names[0], names[1]
                )
            }
            None => format!(
                "unknown {what} `{name}`; expected one of {}",
                names.join(", ")
            ),
        })
    })
}

/// `"; did you mean `x`?"`, or nothing.
pub(crate) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> String {
    suggest(word, candidates).map_or(String::new(), |near| format!("; did you mean `{near}`?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("mxfp4", "mxfp4"), 0);
        assert_eq!(edit_distance("mxfp5", "mxfp4"), 1);
        assert_eq!(edit_distance("sclae", "scale"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("fp8", "fp8_fnuz"), 5);
        assert_eq!(suggest("mxfp5", ["bf16", "mxfp4", "mxfp8"]), Some("mxfp4"));
        assert_eq!(suggest("ab", ["xy"]), None);
    }
}
