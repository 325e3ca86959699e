// SPDX-License-Identifier: GPL-2.0
/*
 * The virtual=1 test GPU of turboinfer.ko: platform device "turboinfer-vgpu" with the
 * Adreno 650 levels as OPPs and a devfreq device under simple_ondemand.
 *
 * Why a separate file: it is test scaffolding, not part of the actuation path. It
 * lets the module run in qemu, where no GPU exists; ti_core.c attaches to it exactly
 * as to a real GPU's devfreq device.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/devfreq.h>
#include <linux/device.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/platform_device.h>
#include <linux/pm_opp.h>

#include "ti_vgpu.h"

#define TI_VGPU_NAME "turboinfer-vgpu"
#define TI_VGPU_INITIAL_HZ 305000000UL

static uint ti_vgpu_busy_pct = 60;
module_param_named(vgpu_busy_pct, ti_vgpu_busy_pct, uint, 0444);
MODULE_PARM_DESC(vgpu_busy_pct, "simulated busy share of the virtual GPU, percent");

/*
 * Adreno 650 levels, Hz (kona-v2-gpu.dtsi, OnePlus sm8250 tree). 305 MHz is its
 * initial level.
 */
static const unsigned long ti_vgpu_levels_hz[] = {
	TI_VGPU_INITIAL_HZ, 400000000, 441600000, 490000000, 525000000, 587000000, 670000000,
};

/* Set by ti_vgpu_create() and cleared by ti_vgpu_destroy(), module init/exit only. */
static struct platform_device *ti_vgpu_pdev;

/* Written by ti_vgpu_target() under devfreq->lock; read locklessly (READ_ONCE). */
static unsigned long ti_vgpu_cur_hz = TI_VGPU_INITIAL_HZ;

static int ti_vgpu_target(struct device *dev, unsigned long *freq, u32 flags)
{
	struct dev_pm_opp *opp;

	opp = devfreq_recommended_opp(dev, freq, flags);
	if (IS_ERR(opp))
		return PTR_ERR(opp);
	dev_pm_opp_put(opp);
	WRITE_ONCE(ti_vgpu_cur_hz, *freq);
	return 0;
}

/*
 * total_time = 0 makes simple_ondemand ask for the top of the allowed range, so the
 * QoS requests alone steer the virtual GPU.
 */
static int ti_vgpu_get_dev_status(struct device *dev, struct devfreq_dev_status *stat)
{
	stat->total_time = 0;
	stat->busy_time = 0;
	stat->current_frequency = READ_ONCE(ti_vgpu_cur_hz);
	return 0;
}

static int ti_vgpu_get_cur_freq(struct device *dev, unsigned long *freq)
{
	*freq = READ_ONCE(ti_vgpu_cur_hz);
	return 0;
}

/*
 * Filled by ti_vgpu_create(); devfreq_add_device() then adds freq_table and max_state
 * from the OPPs, allocated on the platform device, so they go with it.
 */
static struct devfreq_dev_profile ti_vgpu_profile;

int ti_vgpu_create(struct devfreq **df, unsigned int *busy_pct)
{
	struct devfreq *vdf;
	unsigned int i;
	int ret;

	if (ti_vgpu_busy_pct > 100)
		return -EINVAL;
	ti_vgpu_pdev = platform_device_register_simple(TI_VGPU_NAME, PLATFORM_DEVID_NONE,
						       NULL, 0);
	if (IS_ERR(ti_vgpu_pdev))
		return PTR_ERR(ti_vgpu_pdev);
	for (i = 0; i < ARRAY_SIZE(ti_vgpu_levels_hz); i++) {
		ret = dev_pm_opp_add(&ti_vgpu_pdev->dev, ti_vgpu_levels_hz[i], 0);
		if (ret)
			goto err_opp;
	}
	WRITE_ONCE(ti_vgpu_cur_hz, TI_VGPU_INITIAL_HZ);
	ti_vgpu_profile = (struct devfreq_dev_profile){
		.initial_freq = TI_VGPU_INITIAL_HZ,
		.polling_ms = 50,
		.target = ti_vgpu_target,
		.get_dev_status = ti_vgpu_get_dev_status,
		.get_cur_freq = ti_vgpu_get_cur_freq,
	};
	vdf = devfreq_add_device(&ti_vgpu_pdev->dev, &ti_vgpu_profile,
				 DEVFREQ_GOV_SIMPLE_ONDEMAND, NULL);
	if (IS_ERR(vdf)) {
		ret = PTR_ERR(vdf);
		pr_err("devfreq_add_device: %d (is governor_simpleondemand loaded?)\n", ret);
		goto err_opp;
	}
	*df = vdf;
	*busy_pct = ti_vgpu_busy_pct;
	return 0;

err_opp:
	dev_pm_opp_remove_all_dynamic(&ti_vgpu_pdev->dev);
	platform_device_unregister(ti_vgpu_pdev);
	ti_vgpu_pdev = NULL;
	return ret;
}

void ti_vgpu_destroy(struct devfreq *df)
{
	int ret;

	ret = devfreq_remove_device(df);
	if (ret)
		pr_warn("devfreq_remove_device: %d\n", ret);
	dev_pm_opp_remove_all_dynamic(&ti_vgpu_pdev->dev);
	platform_device_unregister(ti_vgpu_pdev);
	ti_vgpu_pdev = NULL;
}
