//! When heap sampling turns on for a memory cgroup under pressure, and off
//! again: a threshold on usage / limit with hysteresis. Pure: samples come
//! in, transitions go out.

use std::collections::HashMap;

/// A change of state for one cgroup.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The cgroup.
    pub path: String,
    /// True: pressure began (sampling turns on); false: it ended.
    pub on: bool,
    /// Usage / limit at the moment, percent (`None`: the cgroup holds no
    /// process any more).
    pub percent: Option<f64>,
}

/// The gate: on at `on_percent` of the limit, off once usage has stayed
/// under `on_percent - HYSTERESIS` for `calm_ns`.
#[derive(Debug)]
pub struct PressureGate {
    on_percent: f64,
    calm_ns: i64,
    /// Cgroups under pressure: path -> since when usage is under the off
    /// threshold (None while above it).
    active: HashMap<String, Option<i64>>,
}

/// Percentage points under the threshold before pressure counts as over.
pub const HYSTERESIS: f64 = 10.0;

impl PressureGate {
    /// A gate at `on_percent` (0-100] of the limit.
    pub fn new(on_percent: f64, calm_ns: i64) -> Self {
        Self {
            on_percent,
            calm_ns,
            active: HashMap::new(),
        }
    }

    /// Cgroups under pressure now.
    pub fn active(&self) -> impl Iterator<Item = &str> {
        self.active.keys().map(String::as_str)
    }

    /// One sample of `path`: its usage and limit (`None`: no limit, never
    /// under pressure) at `now_ns`.
    pub fn sample(
        &mut self,
        path: &str,
        usage: u64,
        limit: Option<u64>,
        now_ns: i64,
    ) -> Option<Transition> {
        let percent = match limit {
            Some(l) if l > 0 => usage as f64 * 100.0 / l as f64,
            _ => 0.0,
        };
        let off_below = self.on_percent - HYSTERESIS;
        match self.active.get_mut(path) {
            None if percent >= self.on_percent => {
                self.active.insert(path.to_string(), None);
                Some(Transition {
                    path: path.into(),
                    on: true,
                    percent: Some(percent),
                })
            }
            None => None,
            Some(calm_since) => {
                if percent >= off_below {
                    *calm_since = None;
                    return None;
                }
                let since = *calm_since.get_or_insert(now_ns);
                if now_ns - since < self.calm_ns {
                    return None;
                }
                self.active.remove(path);
                Some(Transition {
                    path: path.into(),
                    on: false,
                    percent: Some(percent),
                })
            }
        }
    }

    /// The cgroups under pressure that `present` no longer has (no process
    /// left in them): their pressure ends.
    pub fn end_missing(&mut self, present: impl Fn(&str) -> bool) -> Vec<Transition> {
        let gone: Vec<String> = self
            .active
            .keys()
            .filter(|p| !present(p))
            .cloned()
            .collect();
        gone.into_iter()
            .map(|path| {
                self.active.remove(&path);
                Transition {
                    path,
                    on: false,
                    percent: None,
                }
            })
            .collect()
    }

    /// A transition that could not be carried out: the state before it
    /// comes back, and the gate says it again when it still holds.
    pub fn undo(&mut self, t: &Transition) {
        if t.on {
            self.active.remove(&t.path);
        } else {
            self.active.insert(t.path.clone(), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;
    const MIB: u64 = 1 << 20;

    #[test]
    fn on_at_the_threshold_off_after_a_calm_spell_below_the_hysteresis() {
        let mut g = PressureGate::new(90.0, 10 * S);
        let lim = Some(100 * MIB);
        assert_eq!(g.sample("/a", 80 * MIB, lim, 0), None);
        let on = g.sample("/a", 91 * MIB, lim, S).unwrap();
        assert!(on.on && (on.percent.unwrap() - 91.0).abs() < 1e-9);
        // Still on, and not twice.
        assert_eq!(g.sample("/a", 95 * MIB, lim, 2 * S), None);
        // Dips under 80 %, back over it: the calm spell starts again.
        assert_eq!(g.sample("/a", 70 * MIB, lim, 3 * S), None);
        assert_eq!(g.sample("/a", 85 * MIB, lim, 4 * S), None);
        assert_eq!(g.sample("/a", 70 * MIB, lim, 5 * S), None);
        assert_eq!(g.sample("/a", 70 * MIB, lim, 14 * S), None);
        let off = g.sample("/a", 70 * MIB, lim, 15 * S).unwrap();
        assert!(!off.on);
        assert_eq!(g.active().count(), 0);
    }

    #[test]
    fn no_limit_is_no_pressure_and_a_gone_cgroup_ends_it() {
        let mut g = PressureGate::new(50.0, S);
        assert_eq!(g.sample("/free", u64::MAX / 2, None, 0), None);
        assert!(g.sample("/b", 60, Some(100), 0).unwrap().on);
        assert!(g.sample("/c", 60, Some(100), 0).unwrap().on);
        let ended = g.end_missing(|p| p == "/c");
        assert_eq!(
            ended,
            [Transition {
                path: "/b".into(),
                on: false,
                percent: None
            }]
        );
        assert_eq!(g.active().collect::<Vec<_>>(), ["/c"]);
        assert!(g.end_missing(|p| p == "/c").is_empty());
    }

    #[test]
    fn a_transition_not_carried_out_is_undone() {
        let mut g = PressureGate::new(50.0, 0);
        let on = g.sample("/a", 60, Some(100), 0).unwrap();
        g.undo(&on);
        // Not under pressure as far as the gate knows: said again.
        assert!(g.sample("/a", 60, Some(100), S).unwrap().on);
        let off = g.sample("/a", 10, Some(100), 2 * S).unwrap();
        assert!(!off.on);
        g.undo(&off);
        // Still under pressure: the end is said again.
        assert!(!g.sample("/a", 10, Some(100), 3 * S).unwrap().on);
    }
}
