//! Minimal reader of kernel BTF (the `.BTF` format of /sys/kernel/btf/vmlinux): just
//! enough to find struct member offsets and tracepoint prototypes on the running kernel.
//! aya-obj parses BTF too, but does not expose struct members.

use std::{collections::HashMap, path::Path};

use isolator_common::{
    KernelOffsets, OFFSETS_DISK_IN_REQUEST, OFFSETS_HAVE_BLKCG, OFFSETS_THROTTLE_REPASS,
    THROTTLE_FUNCTIONS,
};

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read BTF {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("BTF {0} is malformed: {1}")]
    Malformed(String, &'static str),
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error("kernel BTF: struct {0} has no member {1}")]
    NoMember(String, String),
    #[error("kernel BTF: {0}.{1} is {2} bytes, expected {3}")]
    BadSize(String, String, u32, u32),
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    type_id: u32,
    bit_offset: u32,
}

/// One type record, decoded on demand from the raw type section.
#[derive(Debug, Clone)]
struct Type {
    name: u32,
    kind: u32,
    /// size for INT/STRUCT/UNION/ENUM/FLOAT, referenced type for PTR/TYPEDEF/...
    size_or_type: u32,
    vlen: usize,
    kind_flag: bool,
    /// Byte offset of the trailing data (members, params, array) in the type section.
    extra: usize,
}

/// Parsed kernel BTF. Keeps the raw bytes and an index of record offsets (the kernel has
/// ~100k types; decoding them all would cost tens of MiB of agent memory at startup).
pub struct KernelBtf {
    source: String,
    data: Vec<u8>,
    types_start: usize,
    types_len: usize,
    strings_start: usize,
    strings_len: usize,
    /// Offset of each type record in the type section; index 0 is `void`.
    offsets: Vec<u32>,
    structs_by_name: HashMap<String, Vec<u32>>,
    typedefs_by_name: HashMap<String, u32>,
    /// The kernel functions of THROTTLE_FUNCTIONS this kernel has (BTF FUNC records); only
    /// those are kept, not the tens of thousands of others.
    throttle_functions: Vec<&'static str>,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
}

impl KernelBtf {
    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse_owned(data, &path.display().to_string())
    }

    pub fn parse(data: &[u8], source: &str) -> Result<Self, BtfError> {
        Self::parse_owned(data.to_vec(), source)
    }

    fn parse_owned(data: Vec<u8>, source: &str) -> Result<Self, BtfError> {
        let bad = |why| BtfError::Malformed(source.to_string(), why);
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(bad("bad magic (only little-endian BTF is supported)"));
        }
        let hdr = |off| {
            u32_at(&data, off)
                .map(|v| v as usize)
                .ok_or_else(|| bad("short header"))
        };
        let (hdr_len, type_off, type_len, str_off, str_len) =
            (hdr(4)?, hdr(8)?, hdr(12)?, hdr(16)?, hdr(20)?);
        let types_start = hdr_len + type_off;
        let strings_start = hdr_len + str_off;
        if data.len() < types_start + type_len || data.len() < strings_start + str_len {
            return Err(bad("section out of bounds"));
        }
        let tsec = &data[types_start..types_start + type_len];
        let mut offsets = vec![0u32];
        let mut pos = 0usize;
        while pos < tsec.len() {
            let info = u32_at(tsec, pos + 4).ok_or_else(|| bad("truncated type"))?;
            u32_at(tsec, pos + 8).ok_or_else(|| bad("truncated type"))?;
            offsets.push(pos as u32);
            let vlen = (info & 0xffff) as usize;
            pos += 12;
            pos += match (info >> 24) & 0x1f {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => vlen * 12,
                KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                _ => return Err(bad("unknown type kind")),
            };
            if pos > tsec.len() {
                return Err(bad("truncated type"));
            }
        }
        let mut btf = KernelBtf {
            source: source.to_string(),
            data,
            types_start,
            types_len: type_len,
            strings_start,
            strings_len: str_len,
            offsets,
            structs_by_name: HashMap::new(),
            typedefs_by_name: HashMap::new(),
            throttle_functions: Vec::new(),
        };
        for id in 1..btf.offsets.len() as u32 {
            let t = btf.ty(id).expect("indexed");
            if t.name == 0 {
                continue;
            }
            match t.kind {
                KIND_STRUCT | KIND_UNION => {
                    let name = btf.str_at(t.name).to_string();
                    btf.structs_by_name.entry(name).or_default().push(id)
                }
                KIND_TYPEDEF => {
                    let name = btf.str_at(t.name);
                    if name.starts_with("btf_trace_") {
                        btf.typedefs_by_name.insert(name.to_string(), id);
                    }
                }
                KIND_FUNC => {
                    let name = btf.str_at(t.name);
                    if let Some(f) = THROTTLE_FUNCTIONS.iter().find(|f| **f == name) {
                        btf.throttle_functions.push(f);
                    }
                }
                _ => {}
            }
        }
        Ok(btf)
    }

    fn tsec(&self) -> &[u8] {
        &self.data[self.types_start..self.types_start + self.types_len]
    }

    fn ty(&self, id: u32) -> Option<Type> {
        if id == 0 {
            return Some(Type {
                name: 0,
                kind: 0,
                size_or_type: 0,
                vlen: 0,
                kind_flag: false,
                extra: 0,
            });
        }
        let pos = *self.offsets.get(id as usize)? as usize;
        let t = self.tsec();
        let info = u32_at(t, pos + 4)?;
        Some(Type {
            name: u32_at(t, pos)?,
            kind: (info >> 24) & 0x1f,
            size_or_type: u32_at(t, pos + 8)?,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            extra: pos + 12,
        })
    }

    /// Members of a STRUCT/UNION, or parameters of a FUNC_PROTO (bit_offset 0).
    fn members(&self, t: &Type) -> Vec<Member> {
        let tsec = self.tsec();
        let (stride, is_proto) = match t.kind {
            KIND_STRUCT | KIND_UNION => (12, false),
            KIND_FUNC_PROTO => (8, true),
            _ => return vec![],
        };
        (0..t.vlen)
            .filter_map(|i| {
                let m = t.extra + i * stride;
                let off = if is_proto { 0 } else { u32_at(tsec, m + 8)? };
                Some(Member {
                    name: u32_at(tsec, m)?,
                    type_id: u32_at(tsec, m + 4)?,
                    bit_offset: if t.kind_flag { off & 0xff_ffff } else { off },
                })
            })
            .collect()
    }

    fn array_of(&self, t: &Type) -> Option<(u32, u32)> {
        let tsec = self.tsec();
        Some((u32_at(tsec, t.extra)?, u32_at(tsec, t.extra + 8)?))
    }

    /// Gives up the index and returns the raw BTF bytes.
    pub fn into_raw(self) -> Vec<u8> {
        self.data
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    fn str_at(&self, off: u32) -> &str {
        let strings = &self.data[self.strings_start..self.strings_start + self.strings_len];
        let s = &strings[(off as usize).min(strings.len())..];
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            let Some(t) = self.ty(id) else {
                return 0;
            };
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return id,
            }
        }
        0
    }

    fn size_of(&self, id: u32) -> u32 {
        let id = self.resolve(id);
        let Some(t) = self.ty(id) else {
            return 0;
        };
        match t.kind {
            KIND_PTR => 8,
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT => {
                t.size_or_type
            }
            KIND_ARRAY => self
                .array_of(&t)
                .map(|(e, n)| self.size_of(e).saturating_mul(n))
                .unwrap_or(0),
            _ => 0,
        }
    }

    fn find_struct(&self, name: &str) -> Result<u32, BtfError> {
        // Prefer a complete definition (forward declarations have no members).
        self.structs_by_name
            .get(name)
            .and_then(|ids| {
                ids.iter()
                    .copied()
                    .max_by_key(|&id| self.ty(id).map_or(0, |t| t.vlen))
            })
            .ok_or_else(|| BtfError::NoStruct(name.to_string()))
    }

    /// Finds a member by name, descending into anonymous structs/unions. Returns the byte
    /// offset and the member's type id.
    fn member_in(&self, sid: u32, name: &str) -> Option<(u32, u32)> {
        let t = self.ty(sid)?;
        for m in &self.members(&t) {
            let mname = self.str_at(m.name);
            if mname == name {
                return Some((m.bit_offset / 8, m.type_id));
            }
            if mname.is_empty() {
                let inner = self.resolve(m.type_id);
                let k = self.ty(inner).map(|t| t.kind);
                if matches!(k, Some(KIND_STRUCT) | Some(KIND_UNION)) {
                    if let Some((off, tid)) = self.member_in(inner, name) {
                        return Some((m.bit_offset / 8 + off, tid));
                    }
                }
            }
        }
        None
    }

    /// The function that decides whether blk-throttle holds a bio, if this kernel has one
    /// (CONFIG_BLK_DEV_THROTTLING), in THROTTLE_FUNCTIONS' order of preference.
    pub fn throttle_function(&self) -> Option<&'static str> {
        THROTTLE_FUNCTIONS
            .into_iter()
            .find(|f| self.throttle_functions.contains(f))
    }

    /// Byte offset of `structure.member`, checking the member's size when `size` is given.
    pub fn member_offset(
        &self,
        structure: &str,
        member: &str,
        size: Option<u32>,
    ) -> Result<u32, BtfError> {
        let sid = self.find_struct(structure)?;
        let (off, tid) = self
            .member_in(sid, member)
            .ok_or_else(|| BtfError::NoMember(structure.into(), member.into()))?;
        if let Some(want) = size {
            let got = self.size_of(tid);
            if got != want {
                return Err(BtfError::BadSize(
                    structure.into(),
                    member.into(),
                    got,
                    want,
                ));
            }
        }
        Ok(off)
    }

    /// Parameter type names of a tracepoint (`btf_trace_<name>` typedef), without the
    /// leading `void *__data`. None if the kernel has no such tracepoint.
    pub fn tracepoint_params(&self, name: &str) -> Option<Vec<String>> {
        let td = *self.typedefs_by_name.get(&format!("btf_trace_{name}"))?;
        let ptr = self.resolve(td);
        let proto = self.ty(ptr)?;
        if proto.kind != KIND_PTR {
            return None;
        }
        let fp = self.ty(proto.size_or_type)?;
        if fp.kind != KIND_FUNC_PROTO {
            return None;
        }
        Some(
            self.members(&fp)
                .iter()
                .skip(1)
                .map(|p| self.type_name(p.type_id))
                .collect(),
        )
    }

    fn type_name(&self, id: u32) -> String {
        let Some(t) = self.ty(id) else {
            return "?".into();
        };
        match t.kind {
            KIND_PTR => format!("{}*", self.type_name(t.size_or_type)),
            KIND_STRUCT => format!("struct {}", self.str_at(t.name)),
            KIND_UNION => format!("union {}", self.str_at(t.name)),
            KIND_CONST | KIND_VOLATILE => self.type_name(t.size_or_type),
            0 if id == 0 => "void".into(),
            _ => self.str_at(t.name).to_string(),
        }
    }

    /// Resolves every offset the eBPF programs need on this kernel.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, BtfError> {
        let m = |s: &str, f: &str, size: u32| self.member_offset(s, f, Some(size));
        let mut o = KernelOffsets {
            rq_q: m("request", "q", 8)?,
            rq_bio: m("request", "bio", 8)?,
            rq_cmd_flags: m("request", "cmd_flags", 4)?,
            rq_data_len: m("request", "__data_len", 4)?,
            rq_sector: m("request", "__sector", 8)?,
            rq_start_time_ns: m("request", "start_time_ns", 8)?,
            rq_io_start_time_ns: m("request", "io_start_time_ns", 8)?,
            disk_major: m("gendisk", "major", 4)?,
            disk_first_minor: m("gendisk", "first_minor", 4)?,
            bio_bi_sector: self.member_offset("bio", "bi_iter", None)?
                + m("bvec_iter", "bi_sector", 8)?,
            ..Default::default()
        };
        // The request's gendisk: through its queue from 5.15, in the request itself before
        // 5.17 (5.15 and 5.16 have both; the queue's is preferred).
        match m("request_queue", "disk", 8) {
            Ok(off) => o.q_disk = off,
            Err(queue_err) => match m("request", "rq_disk", 8) {
                Ok(off) => {
                    o.rq_disk = off;
                    o.flags |= OFFSETS_DISK_IN_REQUEST;
                }
                Err(_) => return Err(queue_err),
            },
        }
        // Without CONFIG_BLK_CGROUP there is no bio->bi_blkg: everything is unattributed,
        // which is also what the kernel's accounting says.
        if let Ok(bi_blkg) = m("bio", "bi_blkg", 8) {
            o.bio_bi_blkg = bi_blkg;
            o.blkg_blkcg = m("blkcg_gq", "blkcg", 8)?;
            o.blkcg_css = self.member_offset("blkcg", "css", None)?;
            o.css_cgroup = m("cgroup_subsys_state", "cgroup", 8)?;
            o.cgroup_kn = m("cgroup", "kn", 8)?;
            o.kn_id = m("kernfs_node", "id", 8)?;
            o.flags |= OFFSETS_HAVE_BLKCG;
        }
        // The older decision function is passed again by the bios it let go.
        if self.throttle_function() == Some(THROTTLE_FUNCTIONS[1]) {
            o.flags |= OFFSETS_THROTTLE_REPASS;
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny BTF blob: struct inner { u32 x; }, struct outer { u64 a; union { u32 b;
    /// struct inner c; }; }, typedef for a tracepoint.
    fn blob() -> Vec<u8> {
        let mut strs = b"\0int\0long\0inner\0x\0outer\0a\0b\0c\0".to_vec();
        let off = |s: &str, strs: &[u8]| {
            let needle = format!("\0{s}\0");
            strs.windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut types = Vec::new();
        let mut push = |v: &[u32]| {
            for x in v {
                types.extend_from_slice(&x.to_le_bytes());
            }
        };
        let s = strs.clone();
        // 1: int (4 bytes)
        push(&[off("int", &s), KIND_INT << 24, 4, 32]);
        // 2: long (8 bytes)
        push(&[off("long", &s), KIND_INT << 24, 8, 64]);
        // 3: struct inner { int x @0 }
        push(&[off("inner", &s), (KIND_STRUCT << 24) | 1, 4]);
        push(&[off("x", &s), 1, 0]);
        // 4: anonymous union { int b; struct inner c; }
        push(&[0, (KIND_UNION << 24) | 2, 4]);
        push(&[off("b", &s), 1, 0]);
        push(&[off("c", &s), 3, 0]);
        // 5: struct outer { long a @0; union @64 bits }
        push(&[off("outer", &s), (KIND_STRUCT << 24) | 2, 16]);
        push(&[off("a", &s), 2, 0]);
        push(&[0, 4, 64]);
        let mut out = vec![0x9f, 0xeb, 1, 0];
        out.extend_from_slice(&24u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(types.len() as u32).to_le_bytes());
        out.extend_from_slice(&(types.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strs.len() as u32).to_le_bytes());
        out.extend_from_slice(&types);
        out.append(&mut strs);
        out
    }

    #[test]
    fn finds_members_through_anonymous_unions() {
        let btf = KernelBtf::parse(&blob(), "test").unwrap();
        assert_eq!(btf.member_offset("outer", "a", Some(8)).unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "b", Some(4)).unwrap(), 8);
        assert_eq!(btf.member_offset("outer", "c", Some(4)).unwrap(), 8);
        assert!(matches!(
            btf.member_offset("outer", "a", Some(4)),
            Err(BtfError::BadSize(..))
        ));
        assert!(matches!(
            btf.member_offset("outer", "zz", None),
            Err(BtfError::NoMember(..))
        ));
        assert!(matches!(
            btf.member_offset("nope", "a", None),
            Err(BtfError::NoStruct(..))
        ));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(KernelBtf::parse(b"hello", "x").is_err());
        let mut b = blob();
        b.truncate(40);
        assert!(KernelBtf::parse(&b, "x").is_err());
    }

    #[test]
    fn running_kernel_offsets_resolve() {
        let p = Path::new("/sys/kernel/btf/vmlinux");
        let btf = KernelBtf::from_file(p).expect("kernel BTF at /sys/kernel/btf/vmlinux");
        let o = btf.kernel_offsets().expect("offsets");
        assert!(o.flags & OFFSETS_HAVE_BLKCG != 0);
        let params = btf.tracepoint_params("block_rq_complete").unwrap();
        assert_eq!(params[0], "struct request*");
        assert_eq!(params.len(), 3);
    }
}
