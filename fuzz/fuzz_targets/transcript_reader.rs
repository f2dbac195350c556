//! Feeds arbitrary bytes to the transcript reader (`--resume` reads what a crash, a full disk or
//! another program left): it may refuse the file, never panic; what it accepts is consistent
//! (the complete part and the skipped bytes fit in the input), and replaying the complete part
//! again gives the same conversation with nothing skipped.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.jsonl");
    let Ok(r) = hipscope::app::transcript::replay(path, data) else {
        return;
    };
    assert!(r.complete_len as usize <= data.len());
    assert!(r.skipped_bytes as usize <= data.len());
    let again = hipscope::app::transcript::replay(path, &data[..r.complete_len as usize])
        .expect("the complete part of an accepted file is accepted");
    assert_eq!(again.conversation, r.conversation);
    assert_eq!(again.complete_len, r.complete_len);
    let _ = r
        .conversation
        .to_markdown(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000));
});
