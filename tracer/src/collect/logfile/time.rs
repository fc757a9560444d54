//! The time stamps of saved logs: monotonic, ISO, syslog and `dmesg -T`
//! in the locales people paste from.

/// A time stamp of a known shape: its value, or None when it cannot be a
/// time.
pub(super) type Stamp<T> = Option<T>;

/// The longest uptime a monotonic stamp may say: a century.
pub(super) const MAX_UPTIME_S: u64 = 100 * 366 * 86_400;
/// Years a wall-time stamp may say.
pub(super) const YEARS: std::ops::RangeInclusive<i64> = 1970..=2200;

/// Month names as `dmesg -T`, syslog and the journal write them in the
/// locales people paste from (English, German, French, Spanish, Italian,
/// Portuguese, Dutch, Russian, Polish, Czech, Turkish, Ukrainian,
/// Scandinavian), short and long, lower case and without a final dot; one
/// word never names two months.
pub(super) const MONTHS: [&[&str]; 12] = [
    &[
        "jan",
        "january",
        "januar",
        "janv",
        "janvier",
        "ene",
        "enero",
        "gen",
        "gennaio",
        "janeiro",
        "januari",
        "янв",
        "января",
        "январь",
        "sty",
        "led",
        "oca",
        "січ",
    ],
    &[
        "feb",
        "february",
        "februar",
        "févr",
        "fevr",
        "février",
        "febrero",
        "febbraio",
        "fev",
        "fevereiro",
        "februari",
        "фев",
        "февраля",
        "февраль",
        "lut",
        "úno",
        "şub",
        "лют",
    ],
    &[
        "mar",
        "march",
        "mär",
        "mrz",
        "märz",
        "mars",
        "marzo",
        "março",
        "mrt",
        "maart",
        "мар",
        "марта",
        "март",
        "bře",
        "бер",
    ],
    &[
        "apr",
        "april",
        "avr",
        "avril",
        "abr",
        "abril",
        "aprile",
        "апр",
        "апреля",
        "апрель",
        "kwi",
        "dub",
        "nis",
        "кві",
    ],
    &[
        "may", "mai", "mayo", "mag", "maggio", "maio", "mei", "мая", "май", "maj", "kvě", "тра",
    ],
    &[
        "jun", "june", "juni", "juin", "junio", "giu", "giugno", "junho", "июн", "июня", "июнь",
        "cze", "čvn", "haz", "чер",
    ],
    &[
        "jul", "july", "juli", "juil", "juillet", "julio", "lug", "luglio", "julho", "июл", "июля",
        "июль", "lip", "čvc", "tem", "лип",
    ],
    &[
        "aug",
        "august",
        "août",
        "aout",
        "ago",
        "agosto",
        "augustus",
        "авг",
        "августа",
        "август",
        "sie",
        "srp",
        "ağu",
        "сер",
    ],
    &[
        "sep",
        "sept",
        "september",
        "septembre",
        "septiembre",
        "set",
        "settembre",
        "setembro",
        "сен",
        "сент",
        "сентября",
        "сентябрь",
        "wrz",
        "zář",
        "eyl",
        "вер",
    ],
    &[
        "oct",
        "october",
        "okt",
        "oktober",
        "octobre",
        "octubre",
        "ott",
        "ottobre",
        "out",
        "outubro",
        "окт",
        "октября",
        "октябрь",
        "paź",
        "říj",
        "eki",
        "жов",
    ],
    &[
        "nov",
        "november",
        "novembre",
        "noviembre",
        "novembro",
        "ноя",
        "нояб",
        "ноября",
        "ноябрь",
        "lis",
        "kas",
        "лис",
    ],
    &[
        "dec",
        "december",
        "dez",
        "dezember",
        "déc",
        "decembre",
        "décembre",
        "dic",
        "diciembre",
        "dicembre",
        "dezembro",
        "дек",
        "декабря",
        "декабрь",
        "gru",
        "pro",
        "des",
        "ara",
        "гру",
    ],
];

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
pub(super) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Wall ns of a civil date and time of day, `offset_s` east of UTC; None
/// when the date cannot be one (a year outside [`YEARS`], a 13th month, a
/// 32nd day).
pub(super) fn wall(
    (y, mo, d): (i64, i64, i64),
    (h, mi, s): (i64, i64, i64),
    frac_ns: i64,
    offset_s: i64,
) -> Stamp<i64> {
    if !YEARS.contains(&y) || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    Some(
        ((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_s) * 1_000_000_000)
            + frac_ns,
    )
}

/// A month's number from its name in any of [`MONTHS`]' locales, or from
/// `N月` (Chinese, Japanese).
pub(super) fn month(name: &str) -> Option<i64> {
    if let Some(n) = name.strip_suffix('月') {
        return n.parse().ok().filter(|m| (1..=12).contains(m));
    }
    let name = name.trim_end_matches('.').to_lowercase();
    MONTHS
        .iter()
        .position(|names| names.contains(&name.as_str()))
        .map(|i| i as i64 + 1)
}

/// `HH:MM:SS` -> seconds of the day.
pub(super) fn hms(t: &str) -> Option<(i64, i64, i64)> {
    let mut p = t.split(':').map(|v| v.parse::<i64>().ok());
    let (h, m, s) = (p.next()??, p.next()??, p.next()??);
    (h < 24 && m < 60 && s < 61).then_some((h, m, s))
}

/// `123.456789` -> microseconds; `Some(None)` for digits that cannot be
/// an uptime (more than [`MAX_UPTIME_S`]).
pub(super) fn seconds_us(s: &str) -> Option<Stamp<u64>> {
    let (a, b) = s.trim().split_once('.')?;
    if a.is_empty()
        || b.is_empty()
        || !a.bytes().all(|c| c.is_ascii_digit())
        || !b.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let frac = format!("{:0<6}", b.get(..6).unwrap_or(b));
    let us: u64 = frac.parse().ok()?;
    Some(
        a.parse::<u64>()
            .ok()
            .filter(|w| *w <= MAX_UPTIME_S)
            .map(|w| w * 1_000_000 + us),
    )
}

/// `[  123.456789] ` at the start of `s`: (microseconds, rest).
pub(super) fn mono_prefix(s: &str) -> Option<(Stamp<u64>, &str)> {
    let inner = s.strip_prefix('[')?;
    let (stamp, rest) = inner.split_once(']')?;
    let rest = without_caller(rest);
    Some((seconds_us(stamp)?, rest.strip_prefix(' ').unwrap_or(rest)))
}

/// What follows printk's caller id, where the kernel adds one after the
/// stamp (`CONFIG_PRINTK_CALLER`: `[   50.052086][ T6736] text`, a task's
/// id, or `[ C1]` a CPU's outside a task; a space apart in some consoles'
/// copies, `[71073.562094] [T13546] text`); `rest` itself otherwise.
fn without_caller(rest: &str) -> &str {
    let Some(inner) = rest.strip_prefix('[').or_else(|| rest.strip_prefix(" [")) else {
        return rest;
    };
    let Some((id, after)) = inner.split_once(']') else {
        return rest;
    };
    let id = id.trim_start();
    let caller = id
        .strip_prefix(['T', 'C'])
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if caller { after } else { rest }
}

/// `2025-03-03T10:00:00[.123456][Z|+0000|+00:00]` -> wall ns;
/// `Some(None)` for one of that shape that cannot be a time.
pub(super) fn iso(s: &str) -> Option<Stamp<i64>> {
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|v| v.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let (clock, zone) = match time.find(['Z', '+', '-']) {
        Some(i) => time.split_at(i),
        None => (time, ""),
    };
    // dmesg --time-format iso writes a comma before the fraction.
    let (hms_part, frac) = clock.split_once(['.', ',']).unwrap_or((clock, ""));
    let Some((h, mi, se)) = hms(hms_part) else {
        return Some(None);
    };
    let frac_ns: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").get(..9)?.parse().ok()?
    };
    let offset_s = match zone {
        "" | "Z" => 0,
        z => {
            let sign = if z.starts_with('-') { -1 } else { 1 };
            let digits: String = z[1..].chars().filter(char::is_ascii_digit).collect();
            let hh: i64 = digits.get(..2)?.parse().ok()?;
            let mm: i64 = digits.get(2..4).unwrap_or("00").parse().ok()?;
            sign * (hh * 3600 + mm * 60)
        }
    };
    Some(wall((y, mo, da), (h, mi, se), frac_ns, offset_s))
}

/// `HH:MM:SS` of a known shape (digits and colons): its seconds of the
/// day, or None when out of range.
pub(super) fn hms_shaped(t: &str) -> Option<Stamp<(i64, i64, i64)>> {
    (t.split(':').count() == 3 && t.bytes().all(|c| c.is_ascii_digit() || c == b':'))
        .then(|| hms(t))
}
