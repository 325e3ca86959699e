/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The virtual=1 test GPU (ti_vgpu.c), part of turboinfer.ko: a devfreq device hosted
 * on a platform device, so the module can be exercised without a GPU (the qemu boot
 * test). The rest of the module sees it only as a struct devfreq.
 */
#ifndef TI_VGPU_H
#define TI_VGPU_H

struct devfreq;

/*
 * Register the platform device, its OPPs and its devfreq device (simple_ondemand
 * must be loaded). On success *df is the devfreq device and *busy_pct the simulated
 * busy share, percent. Undo with ti_vgpu_destroy().
 */
int ti_vgpu_create(struct devfreq **df, unsigned int *busy_pct);
void ti_vgpu_destroy(struct devfreq *df);

#endif /* TI_VGPU_H */
