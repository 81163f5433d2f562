//! Shared settings of the property tests (`proptest`).
#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships

use proptest::test_runner::Config;

/// `cases` cases (CI's bound; `PROPTEST_CASES` in the environment wins) and
/// no failure files: a failure prints its minimal input, which a regression
/// test then keeps as an ordinary `#[test]`.
pub(crate) fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    Config { cases, failure_persistence: None, ..Config::default() }
}

/// A password-like marker: upper-case letters start it, so it never occurs
/// in the lower-case names, keys and registries the strategies generate
/// next to it, and an error text that holds it has leaked a secret.
pub(crate) fn marker() -> impl proptest::strategy::Strategy<Value = String> {
    "PWX[A-Za-z0-9]{12}"
}
