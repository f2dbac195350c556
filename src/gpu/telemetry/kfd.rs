//! The GPU's arch name from KFD topology (`/sys/class/kfd/kfd/topology/nodes/*/properties`),
//! which avoids `hipDeviceProp_t::gcnArchName` and its ROCm-6 layout change. A HIP device is
//! matched to its KFD node by PCI location, so `HIP_VISIBLE_DEVICES` renumbering is harmless.

use std::path::Path;

/// One GPU node of KFD topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfdNode {
    pub node: u32,
    /// `gfx_target_version`, e.g. 110001 for gfx1101.
    pub gfx_target_version: u32,
    pub domain: u32,
    /// `(bus << 8) | (device << 3) | function`.
    pub location_id: u32,
    pub simd_count: u32,
    /// CPU cores on the same node: an APU (Strix Halo's node has both).
    pub cpu_cores: u32,
}

impl KfdNode {
    pub fn arch(&self) -> String {
        gfx_name(self.gfx_target_version)
    }
}

/// `110001` → `gfx1101`, `90010` → `gfx90a`, `110501` → `gfx1151`: major·10⁴ + minor·10² +
/// stepping, with the stepping written in hex as LLVM names targets.
pub fn gfx_name(v: u32) -> String {
    let major = v / 10_000;
    let minor = (v / 100) % 100;
    let stepping = v % 100;
    format!("gfx{major}{minor}{stepping:x}")
}

/// Parses one node's `properties` file (`key value` per line). None for CPU-only nodes.
pub fn parse_properties(node: u32, text: &str) -> Option<KfdNode> {
    let mut gfx = None;
    let mut domain = 0;
    let mut location = 0;
    let mut simd = 0;
    let mut cpu_cores = 0;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else { continue };
        match k {
            "gfx_target_version" => gfx = Some(v as u32),
            "domain" => domain = v as u32,
            "location_id" => location = v as u32,
            "simd_count" => simd = v as u32,
            "cpu_cores_count" => cpu_cores = v as u32,
            _ => {}
        }
    }
    let gfx = gfx?;
    if simd == 0 || gfx == 0 {
        return None;
    }
    Some(KfdNode {
        node,
        gfx_target_version: gfx,
        domain,
        location_id: location,
        simd_count: simd,
        cpu_cores,
    })
}

/// Every GPU node under `root` (normally `/sys/class/kfd/kfd/topology/nodes`).
pub fn read_nodes(root: &Path) -> Vec<KfdNode> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut nodes: Vec<KfdNode> = entries
        .flatten()
        .filter_map(|e| {
            let node: u32 = e.file_name().to_str()?.parse().ok()?;
            let text = std::fs::read_to_string(e.path().join("properties")).ok()?;
            parse_properties(node, &text)
        })
        .collect();
    nodes.sort_by_key(|n| n.node);
    nodes
}

/// A PCI address `dddd:bb:dd.f` (as `hipDeviceGetPCIBusId` writes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl PciAddress {
    pub fn parse(s: &str) -> Option<PciAddress> {
        let s = s.trim().trim_end_matches('\0');
        let (domain, rest) = s.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        Some(PciAddress {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u32::from_str_radix(bus, 16).ok()?,
            device: u32::from_str_radix(device, 16).ok()?,
            function: u32::from_str_radix(function, 16).ok()?,
        })
    }

    pub fn location_id(&self) -> u32 {
        (self.bus << 8) | (self.device << 3) | self.function
    }
}

/// The node at this PCI address.
pub fn node_for<'a>(nodes: &'a [KfdNode], pci: &PciAddress) -> Option<&'a KfdNode> {
    nodes
        .iter()
        .find(|n| n.domain == pci.domain && n.location_id == pci.location_id())
}

/// `HSA_OVERRIDE_GFX_VERSION=11.0.0` → `gfx1100`: the runtime then loads code objects built for
/// that target, so that is what kernels must be compiled for.
pub fn override_arch(value: &str) -> Option<String> {
    let mut it = value.trim().split('.');
    let major: u32 = it.next()?.parse().ok()?;
    let minor: u32 = it.next()?.parse().ok()?;
    let stepping: u32 = it.next()?.parse().ok()?;
    if it.next().is_some() || minor > 99 || stepping > 99 {
        return None;
    }
    Some(gfx_name(major * 10_000 + minor * 100 + stepping))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_versions_name_llvm_targets() {
        assert_eq!(gfx_name(110000), "gfx1100");
        assert_eq!(gfx_name(110501), "gfx1151");
        assert_eq!(gfx_name(90010), "gfx90a");
        assert_eq!(gfx_name(100300), "gfx1030");
        assert_eq!(gfx_name(90400), "gfx940");
    }

    #[test]
    fn properties_of_a_gpu_node_parse_and_cpu_nodes_are_skipped() {
        // Abridged from a Radeon RX 7900 XTX's node (amdgpu topology).
        let gpu = "cpu_cores_count 0\nsimd_count 192\nmem_banks_count 1\n\
                   gfx_target_version 110000\nlocation_id 768\ndomain 0\ndrm_render_minor 128\n";
        let n = parse_properties(1, gpu).expect("gpu node");
        assert_eq!(n.arch(), "gfx1100");
        assert_eq!(n.location_id, 768);
        let cpu = "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n";
        assert_eq!(parse_properties(0, cpu), None);
        assert_eq!(parse_properties(2, "garbage\n\n"), None);
    }

    #[test]
    fn pci_addresses_match_kfd_location_ids() {
        let p = PciAddress::parse("0000:03:00.0").expect("parse");
        assert_eq!(p.location_id(), 0x300);
        let nodes = [
            KfdNode {
                node: 1,
                gfx_target_version: 110501,
                domain: 0,
                location_id: 0xc100,
                simd_count: 80,
                cpu_cores: 16,
            },
            KfdNode {
                node: 2,
                gfx_target_version: 110000,
                domain: 0,
                location_id: 0x300,
                simd_count: 192,
                cpu_cores: 0,
            },
        ];
        assert_eq!(node_for(&nodes, &p).map(|n| n.node), Some(2));
        let apu = PciAddress::parse("0000:c1:00.0").expect("parse");
        assert_eq!(
            node_for(&nodes, &apu).map(|n| n.arch()),
            Some("gfx1151".into())
        );
        assert_eq!(PciAddress::parse("03:00.0"), None);
    }

    #[test]
    fn hsa_override_names_a_target() {
        assert_eq!(override_arch("11.0.0").as_deref(), Some("gfx1100"));
        assert_eq!(override_arch("10.3.0").as_deref(), Some("gfx1030"));
        assert_eq!(override_arch("9.0.10").as_deref(), Some("gfx90a"));
        assert_eq!(override_arch("eleven"), None);
    }
}
