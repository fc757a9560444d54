//! The few kernel facts the probes need that differ between kernels, read
//! from the running kernel's BTF (/sys/kernel/btf/vmlinux): struct member
//! offsets and enum values. Nothing of the kind is compiled in.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use btf_rs::{Btf, Type};

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Errors reading kernel BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be opened or parsed.
    #[error(
        "cannot read kernel BTF at {path}; tracer needs a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y (most distribution kernels since 5.4)"
    )]
    Open {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: btf_rs::Error,
    },
    /// A type is not in this kernel's BTF.
    #[error("kernel BTF has no {what}")]
    Missing {
        /// What was looked for.
        what: String,
    },
    /// A lookup failed inside the BTF data.
    #[error("kernel BTF lookup of {what}")]
    Lookup {
        /// What was looked for.
        what: String,
        /// The error.
        #[source]
        source: btf_rs::Error,
    },
}

/// The kernel's BTF, parsed.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    /// Parses the BTF at `path` (normally [`VMLINUX_BTF`]).
    pub fn open(path: &Path) -> Result<Self, BtfError> {
        let btf = Btf::from_file(path).map_err(|source| BtfError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self { btf })
    }

    /// Byte offset of `member` in `struct name` (looking into anonymous
    /// struct/union members, as `task_struct` has them).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        let what = format!("struct {name}.{member}");
        let lookup = |source| BtfError::Lookup {
            what: what.clone(),
            source,
        };
        for ty in self.btf.resolve_types_by_name(name).map_err(lookup)? {
            if let Type::Struct(s) = ty
                && let Some(bits) = self.find_member(&s, member, 0)?
            {
                return Ok(bits / 8);
            }
        }
        Err(BtfError::Missing { what })
    }

    fn find_member(
        &self,
        s: &btf_rs::Struct,
        member: &str,
        base_bits: u32,
    ) -> Result<Option<u32>, BtfError> {
        let lookup = |source| BtfError::Lookup {
            what: member.to_string(),
            source,
        };
        for m in &s.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            let bits = base_bits + m.bit_offset();
            if name == member {
                return Ok(Some(bits));
            }
            if name.is_empty() {
                let inner = self.btf.resolve_chained_type(m).map_err(lookup)?;
                if let Type::Struct(inner) | Type::Union(inner) = inner
                    && let Some(found) = self.find_member(&inner, member, bits)?
                {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// Every value of `enum name`, by member name.
    pub fn enum_values(&self, name: &str) -> Result<HashMap<String, i64>, BtfError> {
        let what = format!("enum {name}");
        let lookup = |source| BtfError::Lookup {
            what: what.clone(),
            source,
        };
        for ty in self.btf.resolve_types_by_name(name).map_err(lookup)? {
            match ty {
                Type::Enum(e) => {
                    return e
                        .members
                        .iter()
                        .map(|m| {
                            let v = if e.is_signed() {
                                i64::from(m.val() as i32)
                            } else {
                                i64::from(m.val())
                            };
                            Ok((self.btf.resolve_name(m).map_err(lookup)?, v))
                        })
                        .collect();
                }
                Type::Enum64(e) => {
                    return e
                        .members
                        .iter()
                        .map(|m| Ok((self.btf.resolve_name(m).map_err(lookup)?, m.val() as i64)))
                        .collect();
                }
                _ => {}
            }
        }
        Err(BtfError::Missing { what })
    }

    /// Whether a type called `name` exists (a quick "is this BTF usable" probe).
    pub fn has_type(&self, name: &str) -> bool {
        self.btf
            .resolve_ids_by_name(name)
            .is_ok_and(|ids| !ids.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel_btf() -> Option<KernelBtf> {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI machines have {VMLINUX_BTF}"
            );
            eprintln!("skipped: {VMLINUX_BTF} missing on this machine");
            return None;
        }
        Some(KernelBtf::open(path).expect("parse vmlinux BTF"))
    }

    #[test]
    fn finds_task_struct_members_of_this_kernel() {
        let Some(btf) = kernel_btf() else { return };
        let pid = btf.member_offset("task_struct", "pid").unwrap();
        let tgid = btf.member_offset("task_struct", "tgid").unwrap();
        // pid_t pid; pid_t tgid; are adjacent in every kernel since 2.6.
        assert_eq!(tgid, pid + 4);
        assert!(matches!(
            btf.member_offset("task_struct", "no_such_member"),
            Err(BtfError::Missing { .. })
        ));
    }

    #[test]
    fn resolves_vm_event_items() {
        let Some(btf) = kernel_btf() else { return };
        let items = btf.enum_values("vm_event_item").unwrap();
        assert_eq!(items["PGPGIN"], 0);
        assert!(items["PGFAULT"] > items["PGPGOUT"]);
        assert!(items.contains_key("PGSCAN_DIRECT"));
        assert!(btf.enum_values("no_such_enum_anywhere").is_err());
    }
}
