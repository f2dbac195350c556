#!/usr/bin/env python3
"""Writes the sysfs/procfs fixture trees for the telemetry, `top` and `doctor` tests:

  rx7900xtx/   a discrete RX 7900 XTX (gfx1100, Navi 31, PCI 1002:744c), gpu_metrics v1.3
  strix-halo/  a Strix Halo APU (gfx1151, Radeon 8060S, PCI 1002:1586), gpu_metrics v3.0,
               512 MiB VRAM carve-out, 64 GiB GTT, MES firmware 0x83 and CWSR on (both known
               issues: ROCm/ROCm#5724, #5590)

Shaped as the kernel lays them out (paths from Documentation/gpu/amdgpu/thermal.rst and
driver-misc.rst; the DRM fdinfo keys from Documentation/gpu/drm-usage-stats.rst). The
gpu_metrics blobs are packed from the field lists of struct gpu_metrics_v1_3 and
gpu_metrics_v3_0 in drivers/gpu/drm/amd/include/kgd_pp_interface.h (Linux 6.12), laid out as
a C compiler lays out those structs (natural alignment, no packing). Re-run after changing it:
  python3 tests/data/sysfs/make_fixtures.py
"""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"u8": 1, "u16": 2, "u32": 4, "u64": 8}
FMT = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q"}


def pack(fields, values):
    """fields: [(name, type, count)]; lays them out as C does; returns bytes."""
    out = bytearray()
    align_max = 1
    for name, ty, count in fields:
        size = SIZES[ty]
        align_max = max(align_max, size)
        while len(out) % size:
            out.append(0)
        v = values.get(name)
        for i in range(count):
            if v is None:
                item = (1 << (8 * size)) - 1 if name.startswith(("temperature", "average", "current")) else 0
            elif isinstance(v, list):
                item = v[i]
            else:
                item = v
            out += struct.pack("<" + FMT[ty], item)
    while len(out) % align_max:
        out.append(0)
    return bytes(out)


def header(fields, values, fmt, content):
    size = len(pack(fields, values))
    values = dict(values, structure_size=size, format_revision=fmt, content_revision=content)
    return pack(fields, values)


HDR = [("structure_size", "u16", 1), ("format_revision", "u8", 1), ("content_revision", "u8", 1)]

V1_3 = HDR + [
    ("temperature_edge", "u16", 1), ("temperature_hotspot", "u16", 1), ("temperature_mem", "u16", 1),
    ("temperature_vrgfx", "u16", 1), ("temperature_vrsoc", "u16", 1), ("temperature_vrmem", "u16", 1),
    ("average_gfx_activity", "u16", 1), ("average_umc_activity", "u16", 1), ("average_mm_activity", "u16", 1),
    ("average_socket_power", "u16", 1), ("energy_accumulator", "u64", 1), ("system_clock_counter", "u64", 1),
    ("average_gfxclk_frequency", "u16", 1), ("average_socclk_frequency", "u16", 1),
    ("average_uclk_frequency", "u16", 1), ("average_vclk0_frequency", "u16", 1),
    ("average_dclk0_frequency", "u16", 1), ("average_vclk1_frequency", "u16", 1),
    ("average_dclk1_frequency", "u16", 1),
    ("current_gfxclk", "u16", 1), ("current_socclk", "u16", 1), ("current_uclk", "u16", 1),
    ("current_vclk0", "u16", 1), ("current_dclk0", "u16", 1), ("current_vclk1", "u16", 1),
    ("current_dclk1", "u16", 1), ("throttle_status", "u32", 1), ("current_fan_speed", "u16", 1),
    ("pcie_link_width", "u16", 1), ("pcie_link_speed", "u16", 1), ("padding", "u16", 1),
    ("gfx_activity_acc", "u32", 1), ("mem_activity_acc", "u32", 1), ("temperature_hbm", "u16", 4),
    ("firmware_timestamp", "u64", 1), ("voltage_soc", "u16", 1), ("voltage_gfx", "u16", 1),
    ("voltage_mem", "u16", 1), ("padding1", "u16", 1), ("indep_throttle_status", "u64", 1),
]

V3_0 = HDR + [
    ("temperature_gfx", "u16", 1), ("temperature_soc", "u16", 1), ("temperature_core", "u16", 16),
    ("temperature_skin", "u16", 1), ("average_gfx_activity", "u16", 1), ("average_vcn_activity", "u16", 1),
    ("average_ipu_activity", "u16", 8), ("average_core_c0_activity", "u16", 16),
    ("average_dram_reads", "u16", 1), ("average_dram_writes", "u16", 1), ("average_ipu_reads", "u16", 1),
    ("average_ipu_writes", "u16", 1), ("system_clock_counter", "u64", 1),
    ("average_socket_power", "u32", 1), ("average_ipu_power", "u16", 1), ("average_apu_power", "u32", 1),
    ("average_gfx_power", "u32", 1), ("average_dgpu_power", "u32", 1), ("average_all_core_power", "u32", 1),
    ("average_core_power", "u16", 16), ("average_sys_power", "u16", 1), ("stapm_power_limit", "u16", 1),
    ("current_stapm_power_limit", "u16", 1), ("average_gfxclk_frequency", "u16", 1),
    ("average_socclk_frequency", "u16", 1), ("average_vpeclk_frequency", "u16", 1),
    ("average_ipuclk_frequency", "u16", 1), ("average_fclk_frequency", "u16", 1),
    ("average_vclk_frequency", "u16", 1), ("average_uclk_frequency", "u16", 1),
    ("average_mpipu_frequency", "u16", 1), ("current_coreclk", "u16", 16),
    ("current_core_maxfreq", "u16", 1), ("current_gfx_maxfreq", "u16", 1),
    ("throttle_residency_prochot", "u32", 1), ("throttle_residency_spl", "u32", 1),
    ("throttle_residency_fppt", "u32", 1), ("throttle_residency_sppt", "u32", 1),
    ("throttle_residency_thm_core", "u32", 1), ("throttle_residency_thm_gfx", "u32", 1),
    ("throttle_residency_thm_soc", "u32", 1), ("time_filter_alphavalue", "u32", 1),
]


def write(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(p, mode) as f:
        f.write(text)


def common_proc(root, release, pid, comm, pdev, vram_kib, gtt_kib):
    write(root, "proc/sys/kernel/osrelease", release + "\n")
    write(root, "proc/stat", "cpu  4705 356 584 3699 23 0 27 5 11 0\ncpu0 1393 280 260 1846 10 0 13 2 5 0\n")
    write(root, "proc/meminfo", "MemTotal:       65536000 kB\nMemFree:  1000 kB\nMemAvailable:   40960000 kB\n")
    write(root, f"proc/{pid}/comm", comm + "\n")
    write(root, f"proc/{pid}/fdinfo/7",
          f"pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1074\ndrm-driver:\tamdgpu\n"
          f"drm-client-id:\t17\ndrm-pdev:\t{pdev}\npasid:\t32771\n"
          f"drm-memory-vram:\t{vram_kib} KiB\ndrm-memory-gtt: \t{gtt_kib} KiB\n"
          f"drm-memory-cpu: \t0 KiB\ndrm-engine-gfx:\t98765432100 ns\n")
    # A second fd of the same client: counted once.
    write(root, f"proc/{pid}/fdinfo/8",
          f"drm-driver:\tamdgpu\ndrm-client-id:\t17\ndrm-pdev:\t{pdev}\n"
          f"drm-memory-vram:\t{vram_kib} KiB\ndrm-memory-gtt: \t{gtt_kib} KiB\n")
    write(root, "proc/1/comm", "systemd\n")
    write(root, "proc/1/fdinfo/3", "pos:\t0\nflags:\t02000002\n")


def rx7900xtx():
    root = os.path.join(HERE, "rx7900xtx")
    shutil.rmtree(root, ignore_errors=True)
    d = "sys/class/drm/card1/device/"
    pdev = "0000:03:00.0"
    for k, v in {
        "vendor": "0x1002", "device": "0x744c", "revision": "0xc8",
        "uevent": f"DRIVER=amdgpu\nPCI_CLASS=30000\nPCI_ID=1002:744C\nPCI_SLOT_NAME={pdev}\n",
        "gpu_busy_percent": "87", "mem_busy_percent": "41",
        "mem_info_vram_total": "25753026560", "mem_info_vram_used": "1203765248",
        "mem_info_vis_vram_total": "25753026560", "mem_info_vis_vram_used": "1203765248",
        "mem_info_gtt_total": "33554432000", "mem_info_gtt_used": "20611072",
        "pp_dpm_sclk": "0: 500Mhz\n1: 2482Mhz *\n2: 2526Mhz\n",
        "pp_dpm_mclk": "0: 96Mhz\n1: 456Mhz\n2: 772Mhz\n3: 1249Mhz *\n",
        "current_link_speed": "16.0 GT/s PCIe", "current_link_width": "16",
        "power/runtime_status": "active",
        "hwmon/hwmon2/name": "amdgpu",
        "hwmon/hwmon2/temp1_label": "edge", "hwmon/hwmon2/temp1_input": "61000",
        "hwmon/hwmon2/temp2_label": "junction", "hwmon/hwmon2/temp2_input": "78000",
        "hwmon/hwmon2/temp3_label": "mem", "hwmon/hwmon2/temp3_input": "70000",
        "hwmon/hwmon2/power1_average": "268000000", "hwmon/hwmon2/power1_cap": "327000000",
        "hwmon/hwmon2/fan1_input": "1450", "hwmon/hwmon2/pwm1": "90",
        "fw_version/mes_fw_version": "0x00000068", "fw_version/mec_fw_version": "0x000001f8",
        "fw_version/smc_fw_version": "0x004e7100",
    }.items():
        write(root, d + k, v + "\n")
    write(root, d + "gpu_metrics", header(V1_3, {
        "temperature_edge": 60, "temperature_hotspot": 77, "temperature_mem": 70,
        "average_gfx_activity": 88, "average_umc_activity": 40, "average_socket_power": 266,
        "current_gfxclk": 2480, "current_uclk": 1249, "current_fan_speed": 1440,
        "average_gfxclk_frequency": 2475, "average_uclk_frequency": 1249,
        "pcie_link_width": 16, "pcie_link_speed": 160,
    }, 1, 3))
    write(root, "sys/class/drm/card1-DP-1/status", "connected\n")
    write(root, "sys/class/drm/renderD128/dev", "226:128\n")
    write(root, "sys/class/kfd/kfd/topology/nodes/0/properties",
          "cpu_cores_count 24\nsimd_count 0\ngfx_target_version 0\nlocation_id 0\ndomain 0\n")
    write(root, "sys/class/kfd/kfd/topology/nodes/1/properties",
          "cpu_cores_count 0\nsimd_count 192\nmem_banks_count 1\ngfx_target_version 110000\n"
          "location_id 768\ndomain 0\ndrm_render_minor 128\n")
    for k, v in {"cwsr_enable": "1", "mes": "1", "sched_policy": "0", "lockup_timeout": "",
                 "gpu_recovery": "-1", "noretry": "-1", "runpm": "-1"}.items():
        write(root, f"sys/module/amdgpu/parameters/{k}", v + "\n")
    common_proc(root, "6.8.0-49-generic", 4242, "llama-server", pdev, 1048576, 2048)


def strix_halo():
    root = os.path.join(HERE, "strix-halo")
    shutil.rmtree(root, ignore_errors=True)
    d = "sys/class/drm/card0/device/"
    pdev = "0000:c2:00.0"
    for k, v in {
        "vendor": "0x1002", "device": "0x1586", "revision": "0xc1",
        "uevent": f"DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_ID=1002:1586\nPCI_SLOT_NAME={pdev}\n",
        "gpu_busy_percent": "93",
        "mem_info_vram_total": "536870912", "mem_info_vram_used": "301989888",
        "mem_info_gtt_total": "68719476736", "mem_info_gtt_used": "21474836480",
        "pp_dpm_sclk": "0: 600Mhz\n1: 2900Mhz *\n",
        "pp_dpm_mclk": "0: 1000Mhz *\n",
        "power/runtime_status": "active",
        "hwmon/hwmon5/name": "amdgpu",
        "hwmon/hwmon5/temp1_label": "edge", "hwmon/hwmon5/temp1_input": "58000",
        "hwmon/hwmon5/power1_input": "85000000",
        "fw_version/mes_fw_version": "0x00000083", "fw_version/mec_fw_version": "0x0000001d",
    }.items():
        write(root, d + k, v + "\n")
    write(root, d + "gpu_metrics", header(V3_0, {
        "temperature_gfx": 5810, "temperature_soc": 5500, "temperature_core": [6000] * 16,
        "temperature_skin": 4000, "average_gfx_activity": 92, "average_vcn_activity": 0,
        "average_ipu_activity": [0] * 8, "average_core_c0_activity": [10] * 16,
        "average_socket_power": 85000, "average_apu_power": 84000, "average_gfx_power": 62000,
        "average_dgpu_power": 0, "average_all_core_power": 15000, "average_core_power": [900] * 16,
        "average_gfxclk_frequency": 2890, "average_uclk_frequency": 1000,
        "current_coreclk": [5100] * 16,
    }, 3, 0))
    write(root, "sys/class/drm/card0-eDP-1/status", "connected\n")
    write(root, "sys/class/kfd/kfd/topology/nodes/0/properties",
          "cpu_cores_count 16\nsimd_count 80\nmem_banks_count 1\ngfx_target_version 110501\n"
          "location_id 49664\ndomain 0\ndrm_render_minor 128\n")
    for k, v in {"cwsr_enable": "1", "mes": "1", "sched_policy": "0", "gpu_recovery": "-1",
                 "noretry": "-1", "runpm": "-1"}.items():
        write(root, f"sys/module/amdgpu/parameters/{k}", v + "\n")
    common_proc(root, "6.14.0-15-generic", 5151, "hipscope", pdev, 307200, 20971520)


if __name__ == "__main__":
    rx7900xtx()
    strix_halo()
