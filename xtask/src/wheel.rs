//! `cargo xtask wheel`: the `trinity` binary as a platform wheel that `pip install` puts on PATH, with libtorch
//! taken from the `torch` package the wheel depends on.
//!
//! What the wheel holds (`trinity-<version>-py3-none-<platform>.whl`, a zip):
//! - `trinity_rs/bin/trinity`, the binary, as package data;
//! - `trinity_rs/_launcher.py`, the console script `trinity` (`entry_points.txt`): it finds the installed `torch`
//!   package with `importlib.util.find_spec`, which locates it without importing it (importing the CUDA build of
//!   torch loads the CUDA libraries, which a CPU machine may lack), puts its `lib/` first on `LD_LIBRARY_PATH` and
//!   `exec`s the binary, so `trinity` is the binary's own process (exit status, signals, stdin untouched);
//! - `METADATA` with `Requires-Dist: torch==2.11.0`, the libtorch tch 0.24 is built against.
//!
//! The import package is `trinity_rs`, not `trinity`: Trinity-RFT's Python package is `trinity`, and a wheel that
//! wrote files into it would break a Trinity-RFT installed in the same environment. The distribution (what pip
//! lists) and the command are `trinity`.
//!
//! The build embeds its own libtorch folder as the binary's run path; a wheel must not carry that (on the build
//! machine it would hide a broken launcher, elsewhere it names a folder that does not exist), so the packaged copy
//! has it rewritten, in place, to `$ORIGIN/../../torch/lib`: the binary run directly still finds a `torch`
//! installed in the same site-packages, as pip installs it. The launcher's `LD_LIBRARY_PATH` (searched before a run
//! path) covers a `torch` anywhere else on `sys.path` (the user site, a `.pth`).
//!
//! CUDA (`--features cuda`): the binary then also needs `libtorch_cuda.so` and `libc10_cuda.so`, which sit in the
//! same `torch/lib` of PyPI's default (CUDA) torch wheel; their own run paths (`$ORIGIN/../../nvidia/*/lib`) find
//! the CUDA wheels torch depends on, exactly as when Python imports torch. A CUDA wheel of trinity therefore needs
//! that torch wheel, not `torch==2.11.0+cpu` (which the same requirement also accepts).
//!
//! The platform tag is `manylinux_2_<N>_<arch>` where `2.N` is the newest glibc symbol version the binary asks for
//! (as auditwheel reads it from the ELF version needs), so the tag claims no more than the binary requires; it does
//! not bundle libtorch the way `auditwheel repair` would bundle a library, because torch is a dependency.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The torch release the binary is built against (tch 0.24; `xtask/src/setup.rs` installs the same).
const TORCH_REQUIREMENT: &str = "torch==2.11.0";

/// Where the packaged binary looks for libtorch when run directly: `site-packages/trinity_rs/bin/` → `site-packages/torch/lib`.
const WHEEL_RUNPATH: &str = "$ORIGIN/../../torch/lib";

const PACKAGE: &str = "trinity_rs";

const LAUNCHER: &str = r#""""The `trinity` command: runs the trinity binary of this package with libtorch from the installed torch."""

import importlib.util
import os
import sys


def torch_lib():
    # find_spec locates the package without importing it: importing the CUDA build of torch loads the CUDA
    # libraries, which this command does not need to find libtorch.
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("trinity: the torch package is not installed in this environment (pip install __TORCH__)")
    for location in spec.submodule_search_locations:
        lib = os.path.join(location, "lib")
        if os.path.isdir(lib):
            return lib
    sys.exit(f"trinity: torch at {list(spec.submodule_search_locations)} has no lib/ folder with libtorch")


def main():
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "trinity")
    paths = [torch_lib()] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
    os.execv(binary, [binary] + sys.argv[1:])


if __name__ == "__main__":
    main()
"#;

/// Writes the wheel of `binary` into `out` and returns its path.
pub(crate) fn package(binary: &Path, out: &Path) -> Result<PathBuf> {
    let mut program = std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    let elf = Elf::parse(&program).with_context(|| format!("{} is not an x86_64 or aarch64 ELF", binary.display()))?;
    let tag = format!("py3-none-{}", platform_tag(&elf, &program)?);
    elf.set_runpath(&mut program, WHEEL_RUNPATH)
        .with_context(|| format!("cannot rewrite the run path of {}", binary.display()))?;
    let version = python_version(env!("CARGO_PKG_VERSION"))?;
    let dist_info = format!("trinity-{version}.dist-info");
    let files: Vec<(String, Vec<u8>, bool)> = vec![
        (
            format!("{PACKAGE}/__init__.py"),
            format!("\"\"\"trinity, the native binary.\"\"\"\n\n__version__ = \"{version}\"\n").into_bytes(),
            false,
        ),
        (format!("{PACKAGE}/__main__.py"), b"from trinity_rs._launcher import main\n\nmain()\n".to_vec(), false),
        (format!("{PACKAGE}/_launcher.py"), LAUNCHER.replace("__TORCH__", TORCH_REQUIREMENT).into_bytes(), false),
        (format!("{PACKAGE}/bin/trinity"), program, true),
        (format!("{dist_info}/METADATA"), metadata(&version).into_bytes(), false),
        (
            format!("{dist_info}/WHEEL"),
            format!("Wheel-Version: 1.0\nGenerator: cargo xtask wheel\nRoot-Is-Purelib: false\nTag: {tag}\n")
                .into_bytes(),
            false,
        ),
        (
            format!("{dist_info}/entry_points.txt"),
            format!("[console_scripts]\ntrinity = {PACKAGE}._launcher:main\n").into_bytes(),
            false,
        ),
    ];
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join(format!("trinity-{version}-{tag}.whl"));
    let file = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let mut record = String::new();
    for (name, bytes, executable) in &files {
        let options = zip::write::FileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(if *executable { 0o755 } else { 0o644 });
        zip.start_file(name.as_str(), options)?;
        zip.write_all(bytes)?;
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes));
        writeln!(record, "{name},sha256={digest},{}", bytes.len())?;
    }
    // RECORD lists itself without a hash (the wheel spec).
    writeln!(record, "{dist_info}/RECORD,,")?;
    zip.start_file(format!("{dist_info}/RECORD"), zip::write::FileOptions::default().unix_permissions(0o644))?;
    zip.write_all(record.as_bytes())?;
    zip.finish()?.flush()?;
    Ok(path)
}

fn metadata(version: &str) -> String {
    format!(
        "Metadata-Version: 2.1\nName: trinity\nVersion: {version}\n\
         Summary: Reinforcement fine-tuning of LLMs in one native binary, the Rust counterpart of Trinity-RFT\n\
         License: Apache-2.0\nRequires-Python: >=3.8\nRequires-Dist: {TORCH_REQUIREMENT}\n"
    )
}

/// The workspace version as a Python version: a plain `X.Y.Z` is both; a semver pre-release or build suffix has
/// no one PEP 440 spelling, so it is refused rather than guessed.
fn python_version(version: &str) -> Result<String> {
    ensure!(
        !version.is_empty()
            && version.split('.').all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit())),
        "the workspace version {version} is not a plain X.Y.Z release, which is what a wheel version can be without guessing"
    );
    Ok(version.to_owned())
}

/// `manylinux_2_<N>_<arch>` for the newest `GLIBC_2.N` the binary needs.
fn platform_tag(elf: &Elf, program: &[u8]) -> Result<String> {
    let mut newest: Option<u32> = None;
    for version in elf.needed_versions(program)? {
        if let Some(minor) = version.strip_prefix("GLIBC_2.") {
            let minor: u32 =
                minor.split('.').next().unwrap_or("").parse().with_context(|| format!("glibc version {version}"))?;
            newest = newest.max(Some(minor));
        }
    }
    let minor = newest.context("the binary asks for no GLIBC_2.* symbol version: not a glibc program")?;
    // manylinux_2_17 is the oldest glibc PEP 600 tags describe.
    Ok(format!("manylinux_2_{}_{}", minor.max(17), elf.arch))
}

/// What this file needs of a little-endian ELF64 executable: where its dynamic section's entries and string table
/// are in the file.
#[derive(Debug)]
struct Elf {
    arch: &'static str,
    /// (file offset, virtual address, size) of each loaded segment, to turn addresses into offsets.
    loads: Vec<(u64, u64, u64)>,
    /// (tag, value) of each dynamic entry.
    dynamic: Vec<(u64, u64)>,
}

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_STRTAB: u64 = 5;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;
const DT_VERNEED: u64 = 0x6fff_fffe;
const DT_VERNEEDNUM: u64 = 0x6fff_ffff;

fn read_u16(bytes: &[u8], at: u64) -> Result<u16> {
    let at = usize::try_from(at)?;
    Ok(u16::from_le_bytes(bytes.get(at..at + 2).context("truncated ELF")?.try_into()?))
}

fn read_u32(bytes: &[u8], at: u64) -> Result<u32> {
    let at = usize::try_from(at)?;
    Ok(u32::from_le_bytes(bytes.get(at..at + 4).context("truncated ELF")?.try_into()?))
}

fn read_u64(bytes: &[u8], at: u64) -> Result<u64> {
    let at = usize::try_from(at)?;
    Ok(u64::from_le_bytes(bytes.get(at..at + 8).context("truncated ELF")?.try_into()?))
}

impl Elf {
    fn parse(bytes: &[u8]) -> Result<Elf> {
        ensure!(bytes.starts_with(b"\x7fELF\x02\x01"), "not a little-endian 64-bit ELF file");
        let arch = match read_u16(bytes, 0x12)? {
            62 => "x86_64",
            183 => "aarch64",
            other => bail!("machine {other} has no manylinux tag here"),
        };
        let (phoff, phentsize, phnum) = (read_u64(bytes, 0x20)?, read_u16(bytes, 0x36)?, read_u16(bytes, 0x38)?);
        let mut loads = Vec::new();
        let mut dynamic_segment = None;
        for i in 0..u64::from(phnum) {
            let header = phoff + i * u64::from(phentsize);
            let (kind, offset, vaddr, size) = (
                read_u32(bytes, header)?,
                read_u64(bytes, header + 8)?,
                read_u64(bytes, header + 16)?,
                read_u64(bytes, header + 32)?,
            );
            match kind {
                PT_LOAD => loads.push((offset, vaddr, size)),
                PT_DYNAMIC => dynamic_segment = Some((offset, size)),
                _ => {}
            }
        }
        let (offset, size) = dynamic_segment.context("no dynamic section: a static binary cannot load libtorch")?;
        let mut dynamic = Vec::new();
        for entry in (offset..offset + size).step_by(16) {
            let (tag, value) = (read_u64(bytes, entry)?, read_u64(bytes, entry + 8)?);
            if tag == 0 {
                break;
            }
            dynamic.push((tag, value));
        }
        Ok(Elf { arch, loads, dynamic })
    }

    fn entry(&self, tag: u64) -> Option<u64> {
        self.dynamic.iter().find(|(t, _)| *t == tag).map(|(_, v)| *v)
    }

    fn offset_of(&self, address: u64) -> Result<u64> {
        self.loads
            .iter()
            .find(|(_, vaddr, size)| (*vaddr..vaddr + size).contains(&address))
            .map(|(offset, vaddr, _)| offset + (address - vaddr))
            .with_context(|| format!("address {address:#x} is in no loaded segment"))
    }

    fn string_table(&self) -> Result<u64> {
        self.offset_of(self.entry(DT_STRTAB).context("no string table")?)
    }

    /// The NUL-terminated string at `index` of the dynamic string table: (file offset, length without the NUL).
    fn string_at(&self, bytes: &[u8], index: u64) -> Result<(usize, usize)> {
        let start = usize::try_from(self.string_table()? + index)?;
        let length =
            bytes.get(start..).and_then(|rest| rest.iter().position(|b| *b == 0)).context("unterminated string")?;
        Ok((start, length))
    }

    /// The symbol versions the binary asks of its libraries (`GLIBC_2.34`, `GLIBCXX_3.4.29`, ...).
    fn needed_versions(&self, bytes: &[u8]) -> Result<Vec<String>> {
        let (Some(address), Some(count)) = (self.entry(DT_VERNEED), self.entry(DT_VERNEEDNUM)) else {
            return Ok(Vec::new());
        };
        let mut versions = Vec::new();
        let mut need = self.offset_of(address)?;
        for _ in 0..count {
            let (aux_count, mut aux) = (read_u16(bytes, need + 2)?, need + u64::from(read_u32(bytes, need + 8)?));
            for _ in 0..aux_count {
                let (start, length) = self.string_at(bytes, u64::from(read_u32(bytes, aux + 8)?))?;
                versions.push(String::from_utf8_lossy(&bytes[start..start + length]).into_owned());
                aux += u64::from(read_u32(bytes, aux + 12)?);
            }
            need += u64::from(read_u32(bytes, need + 12)?);
        }
        Ok(versions)
    }

    /// Overwrites the run path (DT_RUNPATH, or an old-style DT_RPATH) with `path`, padding with NULs: the string
    /// table cannot grow in place, so the new path must be no longer than the old (as `chrpath` requires).
    fn set_runpath(&self, bytes: &mut [u8], path: &str) -> Result<()> {
        let index =
            self.entry(DT_RUNPATH).or_else(|| self.entry(DT_RPATH)).context("the binary has no run path to rewrite")?;
        let (start, length) = self.string_at(bytes, index)?;
        ensure!(
            path.len() <= length,
            "the build's run path {:?} is shorter than {path:?}, which must take its place",
            String::from_utf8_lossy(&bytes[start..start + length])
        );
        bytes[start..start + length].fill(0);
        bytes[start..start + path.len()].copy_from_slice(path.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The xtask binary itself is a dynamically linked glibc ELF: enough to check the reading of version needs.
    #[test]
    fn reads_the_glibc_versions_of_an_elf() {
        let program = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = Elf::parse(&program).unwrap();
        let versions = elf.needed_versions(&program).unwrap();
        assert!(versions.iter().any(|v| v.starts_with("GLIBC_2.")), "{versions:?}");
        let tag = platform_tag(&elf, &program).unwrap();
        assert!(tag.starts_with("manylinux_2_") && tag.ends_with(elf.arch), "{tag}");
    }

    #[test]
    fn a_wheel_version_is_a_plain_release() {
        assert_eq!(python_version("0.1.0").unwrap(), "0.1.0");
        let error = python_version("0.2.0-alpha.1").unwrap_err().to_string();
        assert!(error.contains("not a plain X.Y.Z"), "{error}");
    }
}
