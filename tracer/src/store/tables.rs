//! The store's tables as its bounds see them: one list, which retention by
//! age, shedding to a size and making room on a full file system all
//! iterate, so a new table is bounded by adding one line here.

/// A table and how its bounds treat it.
pub struct Table {
    /// Table name.
    pub name: &'static str,
    /// The column (or expression) that says how old a row is, wall ns.
    pub time: &'static str,
    /// Its place in the order of shedding when the store is over its size
    /// (lowest first); `None`: kept (small, and says what was missed).
    pub shed: Option<u8>,
    /// Whether its oldest rows go when the file system is full (raw events
    /// and timelines; records never).
    pub on_full_disk: bool,
}

const fn t(name: &'static str, time: &'static str, shed: Option<u8>, on_full_disk: bool) -> Table {
    Table {
        name,
        time,
        shed,
        on_full_disk,
    }
}

/// Every table. When the store is over its size, raw events and timelines
/// go first, then ledgers, and the records (GPU OOMs, kills) last.
pub const TABLES: &[Table] = &[
    t("events", "ts_ns", Some(0), true),
    t("kills", "ts_ns", Some(5), false),
    t("drops", "to_ns", None, false),
    t("gpu_ooms", "ts_ns", Some(4), false),
    t("gpu_ledgers", "ts_ns", Some(3), true),
    t("gpu_devices", "ts_ns", Some(2), true),
    t("gpu_processes", "ts_ns", Some(1), true),
    t("sessions", "coalesce(ended_ns, last_seen_ns)", None, false),
];

/// The tables shed to keep the store under its size, in order.
pub fn by_shedding_order() -> Vec<&'static Table> {
    let mut v: Vec<_> = TABLES.iter().filter(|t| t.shed.is_some()).collect();
    v.sort_by_key(|t| t.shed);
    v
}

/// The tables whose oldest rows go when the file system is full.
pub fn on_full_disk() -> impl Iterator<Item = &'static Table> {
    TABLES.iter().filter(|t| t.on_full_disk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_go_last_and_never_for_a_full_disk() {
        let order: Vec<_> = by_shedding_order().iter().map(|t| t.name).collect();
        assert_eq!(order.first(), Some(&"events"));
        assert_eq!(&order[order.len() - 2..], ["gpu_ooms", "kills"]);
        assert!(on_full_disk().all(|t| t.name != "kills" && t.name != "gpu_ooms"));
        let mut ranks: Vec<_> = TABLES.iter().filter_map(|t| t.shed).collect();
        ranks.dedup();
        assert_eq!(ranks.len(), by_shedding_order().len(), "one rank each");
    }

    #[test]
    fn every_table_of_the_schema_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let s = crate::store::Store::open_rw(&dir.path().join("t.db")).unwrap();
        let names: Vec<String> = s
            .conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            )
            .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
            .unwrap();
        assert!(names.len() >= TABLES.len(), "{names:?}");
        for n in &names {
            assert!(
                TABLES.iter().any(|t| t.name == n),
                "{n} is bounded by nothing"
            );
        }
    }
}
