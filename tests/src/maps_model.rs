//! `/proc/self/maps` lines, the plain way: the model that
//! `memhook::maps::parse_line` is held to (`tests/maps_props.rs`, the
//! `maps_line` fuzz target and its corpus's replay).

use memhook::maps::parse_line;

/// What a line says: start, end, protection, shared, offset, device,
/// inode, path (cut as the parser cuts it).
pub type Fields = (usize, usize, i32, bool, u64, (u32, u32), u64, Vec<u8>);

/// The model: the line split at runs of spaces, the path the rest of the
/// line from the field after the inode.
pub fn model(line: &[u8]) -> Option<Fields> {
    // (The fields before the path are ASCII, read as text; the path is
    // bytes, UTF-8 or not.)
    fn text(f: &[u8]) -> Option<&str> {
        std::str::from_utf8(f).ok()
    }
    let hex = |f: &[u8]| {
        (!f.is_empty() && f.len() <= 16 && f.iter().all(u8::is_ascii_hexdigit))
            .then(|| u64::from_str_radix(text(f)?, 16).ok())
            .flatten()
    };
    let split_once = |f: &'_ [u8], c: u8| {
        let i = f.iter().position(|&b| b == c)?;
        Some((f[..i].to_vec(), f[i + 1..].to_vec()))
    };
    let mut fields = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
    let (start, end) = split_once(fields.next()?, b'-')?;
    let perms = fields.next()?;
    let offset = hex(fields.next()?)?;
    let (major, minor) = split_once(fields.next()?, b':')?;
    let inode_field = fields.next()?;
    if inode_field.is_empty() || inode_field.len() > 20 || !inode_field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let inode: u64 = text(inode_field)?.parse().ok()?;
    let (start, end) = (hex(&start)? as usize, hex(&end)? as usize);
    let dev = (hex(&major)? as u32, hex(&minor)? as u32);
    if perms.len() < 4 || end < start {
        return None;
    }
    let prot = [
        (b'r', libc::PROT_READ),
        (b'w', libc::PROT_WRITE),
        (b'x', libc::PROT_EXEC),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(c, p))| if perms[i] == c { p } else { 0 })
    .sum();
    let path = match fields.next() {
        Some(first) => {
            let at = first.as_ptr() as usize - line.as_ptr() as usize;
            line[at..].iter().take(memhook::maps::PATH_CAPACITY).copied().collect()
        }
        None => Vec::new(),
    };
    Some((start, end, prot, perms[3] == b's', offset, dev, inode, path))
}

/// What `parse_line` makes of `line`, as the model's fields.
pub fn parsed(line: &[u8]) -> Option<Fields> {
    parse_line(line).map(|m| {
        (
            m.start,
            m.end,
            m.prot,
            m.shared,
            m.offset,
            m.dev,
            m.inode,
            m.path().to_vec(),
        )
    })
}

/// The parser and the model agree on `line`, whatever its bytes: the
/// same mapping or the same refusal (and no panic).
pub fn check_line(line: &[u8]) {
    assert_eq!(parsed(line), model(line), "{}", String::from_utf8_lossy(line));
}
