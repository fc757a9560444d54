//! Profiles in pprof's format (`profile.proto`, gzipped), the file
//! `go tool pprof`, Pyroscope and Parca read: the heap's live bytes by
//! stack (`attach --host`), growth by stack (`growth`) and device memory
//! by stack (`attach --by stack`), with native and Python frames.
//!
//! The messages are declared here for prost (already in the tree under
//! the OTLP exporter): the crates that ship them compiled also bring a
//! sampling CPU profiler with its signal handlers, which tracer has no
//! use for.

use std::{collections::HashMap, io::Write as _};

use crate::stacks::symbols::Frame;

/// `perftools.profiles.Profile`, the fields tracer writes.
#[derive(Clone, PartialEq, prost::Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
    #[prost(int64, repeated, tag = "13")]
    comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
    #[prost(bool, tag = "8")]
    has_filenames: bool,
    #[prost(bool, tag = "9")]
    has_line_numbers: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
}

/// What a profile measures: its value types (`(type, unit)`, e.g.
/// `("inuse_space", "bytes")`), the sampling period, and a line saying
/// what was traced.
pub struct Meta<'a> {
    /// One per value of each sample; the first is the default.
    pub sample_types: &'a [(&'a str, &'a str)],
    /// `(type, unit, period)`: one sample per `period` units (0: exact).
    pub period: (&'a str, &'a str, u64),
    /// Wall time of the profile, ns.
    pub time_ns: i64,
    /// How long it covers, ns (0: a moment).
    pub duration_ns: i64,
    /// Lines shown with the profile (`go tool pprof -comments`).
    pub comments: Vec<String>,
}

/// One stack and its values.
pub struct Stack<'a> {
    /// Innermost first.
    pub frames: &'a [Frame],
    /// One per sample type.
    pub values: Vec<i64>,
    /// The process, as labels `pid` and `comm` (for profiles of several).
    pub process: Option<(u32, &'a str)>,
}

/// A profile being built: strings, functions, locations and mappings
/// interned as samples come.
struct Builder {
    p: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    locations: HashMap<(u64, i64, u64), u64>,
    mappings: HashMap<i64, u64>,
}

impl Builder {
    fn new() -> Self {
        let mut b = Self {
            p: Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            mappings: HashMap::new(),
        };
        // The format's rule: string 0 is "".
        b.string("");
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(i) = self.strings.get(s) {
            return *i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn mapping(&mut self, module: &str) -> u64 {
        let name = self.string(module);
        if let Some(id) = self.mappings.get(&name) {
            return *id;
        }
        let id = self.p.mapping.len() as u64 + 1;
        self.p.mapping.push(Mapping {
            id,
            filename: name,
            // The frames come named: nothing is left for pprof to symbolize.
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
        });
        self.mappings.insert(name, id);
        id
    }

    /// A frame's location: one per (mapping, function, line).
    fn location(&mut self, f: &Frame) -> u64 {
        let name = match (&f.function, &f.module) {
            (Some(name), _) => name.clone(),
            (None, Some(m)) => format!("?? ({m})"),
            (None, None) => "??".to_string(),
        };
        let name = self.string(&name);
        let file = self.string(f.file.as_deref().unwrap_or(""));
        let function = match self.functions.get(&(name, file)) {
            Some(id) => *id,
            None => {
                let id = self.p.function.len() as u64 + 1;
                self.p.function.push(Function {
                    id,
                    name,
                    system_name: name,
                    filename: file,
                });
                self.functions.insert((name, file), id);
                id
            }
        };
        // Python frames run in the interpreter, not in a file's code.
        let mapping = match &f.module {
            Some(m) if !f.python => self.mapping(m),
            _ => 0,
        };
        let line = i64::from(f.line.unwrap_or(0));
        let key = (mapping, line, function);
        if let Some(id) = self.locations.get(&key) {
            return *id;
        }
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(Location {
            id,
            mapping_id: mapping,
            line: vec![Line {
                function_id: function,
                line,
            }],
        });
        self.locations.insert(key, id);
        id
    }
}

/// The profile of `stacks`, gzipped.
pub fn encode<'a>(meta: &Meta, stacks: impl IntoIterator<Item = Stack<'a>>) -> Vec<u8> {
    let mut b = Builder::new();
    for (t, unit) in meta.sample_types {
        let vt = ValueType {
            r#type: b.string(t),
            unit: b.string(unit),
        };
        b.p.sample_type.push(vt);
    }
    let (t, unit, period) = meta.period;
    b.p.period_type = Some(ValueType {
        r#type: b.string(t),
        unit: b.string(unit),
    });
    b.p.period = period as i64;
    b.p.time_nanos = meta.time_ns;
    b.p.duration_nanos = meta.duration_ns;
    for c in &meta.comments {
        let i = b.string(c);
        b.p.comment.push(i);
    }
    b.p.default_sample_type = b.p.sample_type.first().map(|v| v.r#type).unwrap_or(0);
    for Stack {
        frames,
        values: value,
        process,
    } in stacks
    {
        if value.iter().all(|v| *v == 0) {
            continue;
        }
        let label = match process {
            Some((pid, comm)) => vec![
                Label {
                    key: b.string("pid"),
                    str: 0,
                    num: i64::from(pid),
                },
                Label {
                    key: b.string("comm"),
                    str: b.string(comm),
                    num: 0,
                },
            ],
            None => Vec::new(),
        };
        let mut location_id: Vec<u64> = frames.iter().map(|f| b.location(f)).collect();
        if location_id.is_empty() {
            location_id.push(b.location(&Frame {
                function: Some("<no stack>".into()),
                ..Frame::default()
            }));
        }
        b.p.sample.push(Sample {
            location_id,
            value,
            label,
        });
    }
    let raw = prost::Message::encode_to_vec(&b.p);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writes to memory: nothing to fail.
    let _ = gz.write_all(&raw);
    gz.finish().unwrap_or_default()
}

/// How a profile was sampled, for its comment: "one sample per 512.0 KiB
/// allocated" (`verb`), or `every` when `sample_bytes` is 0.
pub fn sampling(sample_bytes: u64, verb: &str, every: &str) -> String {
    match sample_bytes {
        0 => every.to_string(),
        b => format!("one sample per {} {verb}", crate::util::units::bytes(b)),
    }
}

/// Encodes `stacks` and writes the profile to `path` (as root: never
/// through a link, nor over another user's file), saying so with `what`
/// it profiles.
pub fn write<'a>(
    path: &std::path::Path,
    meta: &Meta,
    stacks: impl IntoIterator<Item = Stack<'a>>,
    what: &str,
) -> anyhow::Result<()> {
    let mut n = 0usize;
    let kept = stacks
        .into_iter()
        .filter(|s| s.values.iter().any(|v| *v != 0))
        .inspect(|_| n += 1);
    let gz = encode(meta, kept);
    crate::util::fsafe::write_private(path, &gz)?;
    crate::say!(
        "tracer: pprof profile of {what} ({n} stacks) written to {}",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(
        function: &str,
        file: Option<&str>,
        line: Option<u32>,
        module: &str,
        python: bool,
    ) -> Frame {
        Frame {
            function: Some(function.into()),
            file: file.map(Into::into),
            line,
            module: Some(module.into()),
            python,
        }
    }

    fn decode(gz: &[u8]) -> Profile {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz), &mut raw).unwrap();
        prost::Message::decode(raw.as_slice()).unwrap()
    }

    #[test]
    fn frames_are_interned_and_samples_keep_their_order_of_frames() {
        let grow = frame("grow", Some("/srv/app.py"), Some(11), "python3.11", true);
        let malloc = frame("malloc", None, None, "libc.so.6", false);
        let a = [malloc.clone(), grow.clone()];
        let b = [
            malloc,
            frame("other", Some("/srv/app.py"), Some(20), "python3.11", true),
        ];
        let meta = Meta {
            sample_types: &[("inuse_space", "bytes"), ("alloc_space", "bytes")],
            period: ("space", "bytes", 524288),
            time_ns: 1,
            duration_ns: 0,
            comments: vec!["tracer attach --host".into()],
        };
        let stack = |frames, values| Stack {
            frames,
            values,
            process: Some((42, "python3")),
        };
        let p = decode(&encode(
            &meta,
            [
                stack(&a[..], vec![100, 200]),
                stack(&b[..], vec![5, 5]),
                stack(&[][..], vec![0, 0]),
            ],
        ));
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample.len(), 2, "a sample of zeros is left out");
        assert_eq!(p.sample[0].value, vec![100, 200]);
        // malloc is one location shared by both samples, first (leaf first).
        assert_eq!(p.sample[0].location_id[0], p.sample[1].location_id[0]);
        assert_eq!(p.location.len(), 3);
        let leaf = &p.location[p.sample[0].location_id[1] as usize - 1];
        let f = &p.function[leaf.line[0].function_id as usize - 1];
        assert_eq!(
            (s(f.name), s(f.filename), leaf.line[0].line),
            ("grow", "/srv/app.py", 11)
        );
        assert_eq!(leaf.mapping_id, 0, "a Python frame has no mapping");
        let m = &p.mapping[p.location[0].mapping_id as usize - 1];
        assert_eq!(s(m.filename), "libc.so.6");
        assert_eq!(s(p.sample_type[1].r#type), "alloc_space");
        assert_eq!(s(p.default_sample_type), "inuse_space");
        assert_eq!(p.period, 524288);
        assert_eq!(s(p.comment[0]), "tracer attach --host");
        let l = &p.sample[1].label;
        assert_eq!(
            (s(l[0].key), l[0].num, s(l[1].key), s(l[1].str)),
            ("pid", 42, "comm", "python3")
        );
    }
}
