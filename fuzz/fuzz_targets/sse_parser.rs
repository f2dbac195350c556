//! Feeds arbitrary bytes, cut into reads at fuzzer-chosen points, to the remote engine's
//! server-sent-events parser and each event's data to the chat-chunk reader: they may refuse the
//! input, never panic; the same bytes in one read give the same events as in several.
#![no_main]

use hipscope::model::remote::openai::parse_chunk;
use hipscope::model::remote::sse::SseParser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let at = usize::from(cut).min(rest.len());
    let mut whole = SseParser::new();
    let one = whole.feed(rest);
    let mut split = SseParser::new();
    let two = split
        .feed(&rest[..at])
        .and_then(|mut a| split.feed(&rest[at..]).map(|b| {
            a.extend(b);
            a
        }));
    if let (Ok(a), Ok(b)) = (&one, &two) {
        assert_eq!(a, b);
        for e in a {
            let _ = parse_chunk(&e.data);
        }
    }
    let _ = whole.finish();
    let _ = split.finish();
});
