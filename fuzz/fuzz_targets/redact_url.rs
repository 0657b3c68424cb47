//! URL redaction: never a panic, and a password that a URL parser finds
//! in the URL never comes out of `redact`.
#![no_main]

use leasehold_redis::redact;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let shown = redact(text);
    let Ok(url) = url::Url::parse(text) else { return };
    let mut secrets: Vec<String> = url.password().map(str::to_owned).into_iter().collect();
    secrets.extend(
        url.query_pairs()
            .filter(|(name, _)| name.eq_ignore_ascii_case("pass") || name.eq_ignore_ascii_case("password"))
            .map(|(_, value)| value.into_owned()),
    );
    for secret in secrets {
        // Only secrets that cannot appear elsewhere by chance are checked.
        if secret.len() >= 8 && text.matches(secret.as_str()).count() == 1 {
            assert!(!shown.contains(&secret), "{text:?} -> {shown:?}");
        }
    }
});
