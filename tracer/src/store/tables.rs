//! The store's tables as retention sees them: one list, so a new table is
//! bounded by adding one line here.

/// A table and the column (or expression) that says how old a row is.
pub struct Table {
    /// Table name.
    pub name: &'static str,
    /// Wall ns of a row.
    pub time: &'static str,
}

const fn t(name: &'static str, time: &'static str) -> Table {
    Table { name, time }
}

/// Every table, for retention by age.
pub const TABLES: &[Table] = &[
    t("events", "ts_ns"),
    t("kills", "ts_ns"),
    t("drops", "to_ns"),
    t("gpu_ooms", "ts_ns"),
    t("gpu_ledgers", "ts_ns"),
    t("gpu_devices", "ts_ns"),
    t("gpu_processes", "ts_ns"),
    t("sessions", "coalesce(ended_ns, last_seen_ns)"),
];

/// What goes first when the store is over its size: raw events and
/// timelines, then ledgers, and the records (GPU OOMs, kills) last.
/// Sessions and drop intervals are small and say what was missed: kept.
pub const BY_SHEDDING_ORDER: &[Table] = &[
    t("events", "ts_ns"),
    t("gpu_processes", "ts_ns"),
    t("gpu_devices", "ts_ns"),
    t("gpu_ledgers", "ts_ns"),
    t("gpu_ooms", "ts_ns"),
    t("kills", "ts_ns"),
];
