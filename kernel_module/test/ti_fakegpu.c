// SPDX-License-Identifier: GPL-2.0
/*
 * ti_fakegpu.ko: a stand-in for a vendor GPU driver, for the boot test only.
 *
 * It registers platform device "13000000.mali" with a devfreq device the way a GPU
 * driver does (OPP table, simple_ondemand, a descending freq_table as KGSL has, a
 * fixed 25% busy ratio), so that turboinfer.ko's target= attach path, table sorting
 * and estimated-busy accounting run under qemu.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/devfreq.h>
#include <linux/module.h>
#include <linux/platform_device.h>
#include <linux/pm_opp.h>

#define TI_FAKE_NAME "13000000.mali"

/* Descending on purpose: turboinfer.ko must sort. Mali-G76-like values, not a real table. */
static unsigned long ti_fake_table_hz[] = { 702000000, 572000000, 325000000 };

static struct platform_device *ti_fake_pdev;
static struct devfreq *ti_fake_df;
static unsigned long ti_fake_cur_hz = 325000000; /* written under devfreq->lock */

static int ti_fake_target(struct device *dev, unsigned long *freq, u32 flags)
{
	struct dev_pm_opp *opp = devfreq_recommended_opp(dev, freq, flags);

	if (IS_ERR(opp))
		return PTR_ERR(opp);
	dev_pm_opp_put(opp);
	WRITE_ONCE(ti_fake_cur_hz, *freq);
	return 0;
}

static int ti_fake_get_dev_status(struct device *dev, struct devfreq_dev_status *stat)
{
	stat->total_time = 1000;
	stat->busy_time = 250;
	stat->current_frequency = READ_ONCE(ti_fake_cur_hz);
	return 0;
}

static int ti_fake_get_cur_freq(struct device *dev, unsigned long *freq)
{
	*freq = READ_ONCE(ti_fake_cur_hz);
	return 0;
}

static struct devfreq_dev_profile ti_fake_profile = {
	.initial_freq = 325000000,
	.polling_ms = 0,
	.target = ti_fake_target,
	.get_dev_status = ti_fake_get_dev_status,
	.get_cur_freq = ti_fake_get_cur_freq,
	.freq_table = ti_fake_table_hz,
	.max_state = ARRAY_SIZE(ti_fake_table_hz),
};

static int __init ti_fake_init(void)
{
	unsigned int i;
	int ret;

	ti_fake_pdev = platform_device_register_simple(TI_FAKE_NAME, PLATFORM_DEVID_NONE, NULL, 0);
	if (IS_ERR(ti_fake_pdev))
		return PTR_ERR(ti_fake_pdev);
	for (i = 0; i < ARRAY_SIZE(ti_fake_table_hz); i++) {
		ret = dev_pm_opp_add(&ti_fake_pdev->dev, ti_fake_table_hz[i], 0);
		if (ret)
			goto err_opp;
	}
	ti_fake_df = devfreq_add_device(&ti_fake_pdev->dev, &ti_fake_profile,
					DEVFREQ_GOV_SIMPLE_ONDEMAND, NULL);
	if (IS_ERR(ti_fake_df)) {
		ret = PTR_ERR(ti_fake_df);
		goto err_opp;
	}
	return 0;

err_opp:
	dev_pm_opp_remove_all_dynamic(&ti_fake_pdev->dev);
	platform_device_unregister(ti_fake_pdev);
	return ret;
}

static void __exit ti_fake_exit(void)
{
	if (devfreq_remove_device(ti_fake_df))
		pr_warn("devfreq_remove_device failed\n");
	dev_pm_opp_remove_all_dynamic(&ti_fake_pdev->dev);
	platform_device_unregister(ti_fake_pdev);
}

module_init(ti_fake_init);
module_exit(ti_fake_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Fake devfreq GPU for turboinfer.ko's boot test");
