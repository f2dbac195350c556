//! Driving a real inference worker from a test (worker_context, reasoning_chat).

use std::time::{Duration, Instant};

use hipscope::model::protocol::Event;
use hipscope::model::worker::WorkerHandle;

/// Events until one that `stop` accepts (which is returned last); fails after 120 s.
pub fn until(w: &mut WorkerHandle, what: &str, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    loop {
        match w.events.try_recv() {
            Ok(e) => {
                let done = stop(&e);
                seen.push(e);
                if done {
                    return seen;
                }
            }
            Err(_) => {
                assert!(Instant::now() < deadline, "no {what}; saw {seen:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}
