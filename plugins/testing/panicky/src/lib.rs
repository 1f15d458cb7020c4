//! For taper's tests: an OOM policy plugin that panics, to check that the
//! panic is caught at the ABI boundary and reported as the run's error.

use taper_plugin::{OomAction, OomEvent, Plugin, KIND_OOM_POLICY};

struct Panicky;

impl Plugin for Panicky {
    const KINDS: u32 = KIND_OOM_POLICY;
    fn create(_config: &str) -> Result<Self, String> {
        Ok(Panicky)
    }
    fn on_oom(&mut self, ev: &OomEvent) -> Result<OomAction, String> {
        panic!("no policy for step {}", ev.step)
    }
}

taper_plugin::export!(Panicky, name = "panicky");
