//! Parsing of hook-mode settings.
//!
//! `MEMHOOK_CUDA_HOOK_MODE` takes a comma list of `bistro`, `reloc`,
//! `procaddr`, or `none` (default `bistro,reloc,procaddr`);
//! `MEMHOOK_MMAP_HOOK_MODE` takes one of `bistro`, `reloc`, `none` (default
//! `bistro`). Whitespace around tokens is ignored and duplicates are allowed.
//! The config string of `memhook_install` joins both with the environment's
//! syntax: `"cuda=bistro,reloc;mmap=bistro"`.
//!
//! Errors name the bad token and list the valid ones, without allocating.
//!
//! ```
//! use memhook_core::config::{Family, HookMode, ModeSet};
//!
//! let modes = ModeSet::parse(" reloc , bistro,reloc", Family::Cuda, ModeSet::ALL).unwrap();
//! assert!(modes.contains(HookMode::Bistro) && modes.contains(HookMode::Reloc));
//! let err = ModeSet::parse("bistro,relco", Family::Cuda, ModeSet::ALL).unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "MEMHOOK_CUDA_HOOK_MODE: unknown hook mode `relco`; valid: bistro, reloc, procaddr, none"
//! );
//! ```

use core::fmt;

/// One way of installing a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookMode {
    /// Binary instrumentation of the function entry.
    Bistro,
    /// ELF relocation slots (GOT/PLT).
    Reloc,
    /// `dlsym`/`cuGetProcAddress` interposition (CUDA only).
    Procaddr,
}

impl HookMode {
    /// Every mode, in the order they are tried.
    pub const ALL: [HookMode; 3] = [HookMode::Bistro, HookMode::Reloc, HookMode::Procaddr];

    /// The token used in settings.
    pub const fn name(self) -> &'static str {
        match self {
            HookMode::Bistro => "bistro",
            HookMode::Reloc => "reloc",
            HookMode::Procaddr => "procaddr",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            HookMode::Bistro => 1,
            HookMode::Reloc => 2,
            HookMode::Procaddr => 4,
        }
    }

    fn from_token(token: &str) -> Option<HookMode> {
        HookMode::ALL.into_iter().find(|m| m.name() == token)
    }
}

/// A set of hook modes; empty means `none`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ModeSet(u8);

impl ModeSet {
    /// No mode: hooks of this family are not installed.
    pub const NONE: ModeSet = ModeSet(0);
    /// Every mode.
    pub const ALL: ModeSet = ModeSet(7);

    /// The set holding exactly `modes`.
    pub const fn of(modes: &[HookMode]) -> ModeSet {
        let mut bits = 0;
        let mut i = 0;
        while i < modes.len() {
            bits |= modes[i].bit();
            i += 1;
        }
        ModeSet(bits)
    }

    /// Whether `mode` is in the set.
    pub const fn contains(self, mode: HookMode) -> bool {
        self.0 & mode.bit() != 0
    }

    /// Whether the set is empty (`none`).
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set with `mode` added.
    pub const fn with(self, mode: HookMode) -> ModeSet {
        ModeSet(self.0 | mode.bit())
    }

    /// The set with `mode` taken out.
    pub const fn without(self, mode: HookMode) -> ModeSet {
        ModeSet(self.0 & !mode.bit())
    }

    /// The set as bits, one a mode (within [`ModeSet::ALL`]'s): a word to
    /// keep it in an atomic.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The set of `bits` ([`ModeSet::bits`]'s); other bits are left out.
    pub const fn from_bits(bits: u8) -> ModeSet {
        ModeSet(bits & ModeSet::ALL.0)
    }

    /// The modes in the set, in [`HookMode::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = HookMode> {
        HookMode::ALL.into_iter().filter(move |m| self.contains(*m))
    }

    /// Parses a setting of `family`. `available` holds the modes this build
    /// supports (bistro is absent when the `bistro` feature is off).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first bad token.
    pub fn parse(value: &str, family: Family, available: ModeSet) -> Result<ModeSet, ConfigError> {
        let mut set = ModeSet::NONE;
        let mut saw_none = false;
        for raw in value.split(',') {
            let token = raw.trim();
            if token.is_empty() {
                return Err(ConfigError::new(family, ConfigErrorKind::EmptyToken, value));
            }
            if token == "none" {
                saw_none = true;
                continue;
            }
            let Some(mode) = HookMode::from_token(token) else {
                return Err(ConfigError::new(family, ConfigErrorKind::UnknownMode, token));
            };
            if !family.valid().contains(mode) {
                return Err(ConfigError::new(family, ConfigErrorKind::NotForFamily, token));
            }
            if !available.contains(mode) {
                return Err(ConfigError::new(family, ConfigErrorKind::NotBuilt, token));
            }
            set = set.with(mode);
        }
        if saw_none && !set.is_empty() {
            return Err(ConfigError::new(family, ConfigErrorKind::NoneWithOthers, value.trim()));
        }
        if family == Family::Mmap && set.iter().count() > 1 {
            return Err(ConfigError::new(family, ConfigErrorKind::OneModeOnly, value.trim()));
        }
        Ok(set)
    }
}

impl fmt::Display for ModeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (i, mode) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(mode.name())?;
        }
        Ok(())
    }
}

/// Which family of hooks a setting is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// CUDA driver and runtime allocation functions.
    Cuda,
    /// mmap, munmap, mremap, shmat, shmdt, brk, sbrk, madvise.
    Mmap,
}

impl Family {
    /// The environment variable that sets this family's modes.
    pub const fn env_var(self) -> &'static str {
        match self.env_var_c().to_str() {
            Ok(name) => name,
            Err(_) => panic!("an ASCII name"),
        }
    }

    /// [`Self::env_var`] as a C string, for `getenv`.
    pub const fn env_var_c(self) -> &'static core::ffi::CStr {
        match self {
            Family::Cuda => c"MEMHOOK_CUDA_HOOK_MODE",
            Family::Mmap => c"MEMHOOK_MMAP_HOOK_MODE",
        }
    }

    /// The key in a config string.
    pub const fn key(self) -> &'static str {
        match self {
            Family::Cuda => "cuda",
            Family::Mmap => "mmap",
        }
    }

    /// Modes that make sense for this family.
    pub const fn valid(self) -> ModeSet {
        match self {
            Family::Cuda => ModeSet::ALL,
            Family::Mmap => ModeSet::of(&[HookMode::Bistro, HookMode::Reloc]),
        }
    }

    /// The default, before `available` is applied.
    pub const fn default_modes(self) -> ModeSet {
        match self {
            Family::Cuda => ModeSet::ALL,
            Family::Mmap => ModeSet::of(&[HookMode::Bistro]),
        }
    }

    /// The valid tokens, as error messages list them.
    pub const fn valid_tokens(self) -> &'static str {
        match self {
            Family::Cuda => "bistro, reloc, procaddr, none",
            Family::Mmap => "bistro, reloc, none",
        }
    }
}

/// What was wrong with a setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// A token that is no mode at all.
    UnknownMode,
    /// A mode that this family does not have (`procaddr` for mmap).
    NotForFamily,
    /// A mode this build was compiled without (bistro without the `bistro`
    /// feature).
    NotBuilt,
    /// `none` together with other modes, or alone with an empty list.
    NoneWithOthers,
    /// An empty token (`"bistro,,reloc"`, or an empty value).
    EmptyToken,
    /// More than one mode where one is allowed (mmap).
    OneModeOnly,
    /// A config-string key other than `cuda` and `mmap`.
    UnknownKey,
    /// A config-string part without `=`.
    MissingEquals,
    /// A config-string key given twice (`"mmap=reloc;mmap=bistro"`): which
    /// one was meant is not known.
    RepeatedKey,
}

/// Longest token an error keeps (longer ones are cut, marked with `...`).
pub const TOKEN_CAPACITY: usize = 48;

/// A bad setting: which family, what was wrong, and the offending token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The family the setting was for (`None` for config-string syntax errors).
    pub family: Option<Family>,
    /// What was wrong.
    pub kind: ConfigErrorKind,
    /// The offending token (cut at [`TOKEN_CAPACITY`] bytes).
    pub token: heapless::String<TOKEN_CAPACITY>,
    truncated: bool,
    /// Whether the setting came from a config string (`"mmap=..."`), not
    /// the family's environment variable: the message names the key then.
    in_string: bool,
}

impl ConfigError {
    fn new(family: Family, kind: ConfigErrorKind, token: &str) -> Self {
        Self::with_family(Some(family), kind, token)
    }

    fn with_family(family: Option<Family>, kind: ConfigErrorKind, token: &str) -> Self {
        let mut kept = heapless::String::new();
        let mut truncated = false;
        for c in token.chars() {
            if kept.push(c).is_err() {
                truncated = true;
                break;
            }
        }
        ConfigError {
            family,
            kind,
            token: kept,
            truncated,
            in_string: false,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dots = if self.truncated { "..." } else { "" };
        let token = self.token.as_str();
        if let Some(family) = self.family {
            if self.in_string {
                write!(f, "config `{}=`: ", family.key())?;
            } else {
                write!(f, "{}: ", family.env_var())?;
            }
            let valid = family.valid_tokens();
            return match self.kind {
                ConfigErrorKind::UnknownMode => {
                    write!(f, "unknown hook mode `{token}{dots}`; valid: {valid}")
                }
                ConfigErrorKind::NotForFamily => write!(
                    f,
                    "hook mode `{token}` does not apply to {} hooks; valid: {valid}",
                    family.key()
                ),
                ConfigErrorKind::NotBuilt => write!(
                    f,
                    "hook mode `{token}` is not available: memhook was built without the `{token}` feature"
                ),
                ConfigErrorKind::NoneWithOthers => {
                    write!(
                        f,
                        "`none` cannot be combined with other modes (got `{token}{dots}`); valid: {valid}"
                    )
                }
                ConfigErrorKind::EmptyToken if token.trim().is_empty() => {
                    write!(f, "no hook mode given; valid: {valid}")
                }
                ConfigErrorKind::EmptyToken => {
                    write!(f, "empty hook mode in `{token}{dots}`; valid: {valid}")
                }
                ConfigErrorKind::OneModeOnly => {
                    write!(f, "takes exactly one mode, got `{token}{dots}`; valid: {valid}")
                }
                ConfigErrorKind::UnknownKey | ConfigErrorKind::MissingEquals | ConfigErrorKind::RepeatedKey => {
                    write!(f, "bad setting `{token}{dots}`")
                }
            };
        }
        match self.kind {
            ConfigErrorKind::UnknownKey => {
                write!(f, "config: unknown key `{token}{dots}`; valid keys: cuda, mmap")
            }
            ConfigErrorKind::RepeatedKey => {
                write!(f, "config: key `{token}{dots}` given twice; give each key once")
            }
            _ => write!(
                f,
                "config: expected `key=modes` in `{token}{dots}` (e.g. \"cuda=bistro,reloc;mmap=bistro\")"
            ),
        }
    }
}

impl core::error::Error for ConfigError {}

/// Hook modes for both families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookConfig {
    /// CUDA hook modes.
    pub cuda: ModeSet,
    /// Host-memory hook modes (at most one).
    pub mmap: ModeSet,
}

impl HookConfig {
    /// The defaults, limited to what this build has.
    pub const fn defaults(available: ModeSet) -> HookConfig {
        HookConfig {
            cuda: ModeSet(Family::Cuda.default_modes().0 & available.0),
            mmap: ModeSet(Family::Mmap.default_modes().0 & available.0),
        }
    }

    /// The modes of `family`.
    pub const fn modes(&self, family: Family) -> ModeSet {
        match family {
            Family::Cuda => self.cuda,
            Family::Mmap => self.mmap,
        }
    }

    /// Parses a config string such as `"cuda=bistro,reloc;mmap=none"`. Keys
    /// left out keep their defaults; an empty string gives the defaults; a
    /// key given twice is an error.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first bad part or token.
    pub fn parse(value: &str, available: ModeSet) -> Result<HookConfig, ConfigError> {
        let mut config = HookConfig::defaults(available);
        let mut given = [false; 2];
        for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, modes)) = part.split_once('=') else {
                return Err(ConfigError::with_family(None, ConfigErrorKind::MissingEquals, part));
            };
            let family = match key.trim() {
                "cuda" => Family::Cuda,
                "mmap" => Family::Mmap,
                other => {
                    return Err(ConfigError::with_family(None, ConfigErrorKind::UnknownKey, other));
                }
            };
            let seen = &mut given[family as usize];
            if core::mem::replace(seen, true) {
                return Err(ConfigError::with_family(
                    None,
                    ConfigErrorKind::RepeatedKey,
                    family.key(),
                ));
            }
            let set = ModeSet::parse(modes, family, available).map_err(|e| ConfigError { in_string: true, ..e })?;
            match family {
                Family::Cuda => config.cuda = set,
                Family::Mmap => config.mmap = set,
            }
        }
        Ok(config)
    }
}

#[cfg(all(test, not(memhook_loom)))]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    const B: HookMode = HookMode::Bistro;
    const R: HookMode = HookMode::Reloc;
    const P: HookMode = HookMode::Procaddr;

    /// Every set comes back from its bits, and bits of no mode are left
    /// out (the word `memhook::installed` keeps the installed config in).
    #[test]
    fn a_set_comes_back_from_its_bits() {
        for bits in 0..=ModeSet::ALL.bits() {
            let set = ModeSet::from_bits(bits);
            assert_eq!(ModeSet::from_bits(set.bits()), set);
            assert_eq!(set.iter().count(), bits.count_ones() as usize);
        }
        assert_eq!(ModeSet::from_bits(0xff), ModeSet::ALL);
        assert_eq!(ModeSet::of(&[HookMode::Reloc]).bits().count_ones(), 1);
    }

    #[test]
    fn every_valid_cuda_form() {
        let cases: &[(&str, ModeSet)] = &[
            ("bistro", ModeSet::of(&[B])),
            ("reloc", ModeSet::of(&[R])),
            ("procaddr", ModeSet::of(&[P])),
            ("none", ModeSet::NONE),
            (" none ", ModeSet::NONE),
            ("bistro,reloc", ModeSet::of(&[B, R])),
            ("reloc , bistro", ModeSet::of(&[B, R])),
            ("bistro,reloc,procaddr", ModeSet::ALL),
            ("procaddr,procaddr", ModeSet::of(&[P])),
            ("\tbistro\n", ModeSet::of(&[B])),
        ];
        for (text, want) in cases {
            assert_eq!(ModeSet::parse(text, Family::Cuda, ModeSet::ALL), Ok(*want), "{text:?}");
        }
    }

    #[test]
    fn mmap_takes_one_mode() {
        assert_eq!(
            ModeSet::parse("reloc", Family::Mmap, ModeSet::ALL),
            Ok(ModeSet::of(&[R]))
        );
        assert_eq!(
            ModeSet::parse("bistro,bistro", Family::Mmap, ModeSet::ALL),
            Ok(ModeSet::of(&[B]))
        );
        let e = ModeSet::parse("bistro,reloc", Family::Mmap, ModeSet::ALL).unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::OneModeOnly);
        let e = ModeSet::parse("procaddr", Family::Mmap, ModeSet::ALL).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MEMHOOK_MMAP_HOOK_MODE: hook mode `procaddr` does not apply to mmap hooks; valid: bistro, reloc, none"
        );
    }

    #[test]
    fn bad_tokens_are_named() {
        let cases: &[(&str, ConfigErrorKind, &str)] = &[
            ("bistr", ConfigErrorKind::UnknownMode, "bistr"),
            ("bistro, BISTRO", ConfigErrorKind::UnknownMode, "BISTRO"),
            ("", ConfigErrorKind::EmptyToken, ""),
            ("bistro,,reloc", ConfigErrorKind::EmptyToken, "bistro,,reloc"),
            ("none,reloc", ConfigErrorKind::NoneWithOthers, "none,reloc"),
        ];
        for (text, kind, token) in cases {
            let e = ModeSet::parse(text, Family::Cuda, ModeSet::ALL).unwrap_err();
            assert_eq!((e.kind, e.token.as_str()), (*kind, *token), "{text:?}");
            assert!(e.to_string().starts_with("MEMHOOK_CUDA_HOOK_MODE: "), "{e}");
        }
        let long = "x".repeat(100);
        let e = ModeSet::parse(&long, Family::Cuda, ModeSet::ALL).unwrap_err();
        assert!(
            e.to_string()
                .contains(&std::format!("`{}...`", "x".repeat(TOKEN_CAPACITY)))
        );
    }

    #[test]
    fn unavailable_mode_is_a_clear_error() {
        let no_bistro = ModeSet::ALL.without(B);
        let e = ModeSet::parse("reloc,bistro", Family::Cuda, no_bistro).unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::NotBuilt);
        assert!(e.to_string().contains("built without the `bistro` feature"), "{e}");
        assert_eq!(HookConfig::defaults(no_bistro).mmap, ModeSet::NONE);
        assert_eq!(HookConfig::defaults(no_bistro).cuda, ModeSet::of(&[R, P]));
    }

    #[test]
    fn config_strings() {
        let c = HookConfig::parse("cuda=bistro,reloc;mmap=none", ModeSet::ALL).unwrap();
        assert_eq!((c.cuda, c.mmap), (ModeSet::of(&[B, R]), ModeSet::NONE));
        let c = HookConfig::parse(" mmap = reloc ; ", ModeSet::ALL).unwrap();
        assert_eq!((c.cuda, c.mmap), (ModeSet::ALL, ModeSet::of(&[R])));
        assert_eq!(
            HookConfig::parse("", ModeSet::ALL),
            Ok(HookConfig::defaults(ModeSet::ALL))
        );
        let e = HookConfig::parse("gpu=reloc", ModeSet::ALL).unwrap_err();
        assert_eq!(e.to_string(), "config: unknown key `gpu`; valid keys: cuda, mmap");
        let e = HookConfig::parse("cuda", ModeSet::ALL).unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::MissingEquals);
        let e = HookConfig::parse("cuda=reloc;mmap=bistr0", ModeSet::ALL).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config `mmap=`: unknown hook mode `bistr0`; valid: bistro, reloc, none"
        );
        let e = HookConfig::parse("cuda=reloc,none", ModeSet::ALL).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config `cuda=`: `none` cannot be combined with other modes (got `reloc,none`); valid: bistro, reloc, procaddr, none"
        );
        let e = HookConfig::parse("cuda=reloc;mmap= ", ModeSet::ALL).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config `mmap=`: no hook mode given; valid: bistro, reloc, none"
        );
        // The environment's variable names itself.
        let e = ModeSet::parse("bistr0", Family::Mmap, ModeSet::ALL).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MEMHOOK_MMAP_HOOK_MODE: unknown hook mode `bistr0`; valid: bistro, reloc, none"
        );
        // A key given twice: which was meant is not known.
        for twice in ["mmap=reloc;mmap=bistro", "cuda=none; mmap=reloc ;cuda=none"] {
            let e = HookConfig::parse(twice, ModeSet::ALL).unwrap_err();
            assert_eq!(e.kind, ConfigErrorKind::RepeatedKey, "{twice}");
        }
        let e = HookConfig::parse("mmap=reloc;mmap=bistro", ModeSet::ALL).unwrap_err();
        assert_eq!(e.to_string(), "config: key `mmap` given twice; give each key once");
        assert_eq!(ModeSet::of(&[B, P]).to_string(), "bistro,procaddr");
        assert_eq!(ModeSet::NONE.to_string(), "none");
    }
}
