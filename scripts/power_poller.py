"""power_poller.py: the GPU's power, SM clock and energy while a benchmark child trains, read back for its
timed steps.

Why: under sustained load an H100 runs at its board power limit (700 W) and the SM clock drops until the
power fits. A step's time then follows its energy, so two trainers at the limit are apart in speed by
about the ratio of their joules per step; the poller shows whether a run was there.

PowerPoller samples NVML (the nvidia-ml-py package's pynvml) every `interval` seconds on a thread: the
board's total-energy counter, the SM clock and whether the software power cap holds the clocks back. It
also notes the time at which each new step line appears in the child's log (`is_step_line` says which
lines are steps), so that timed_steps() can give the mean power, clock and energy over the steps after
the warm-up. Without pynvml or an NVIDIA GPU it samples nothing and says why in `error`.
"""
import threading
import time

try:
    import pynvml
except ImportError:  # CPU-only machines; `pip install nvidia-ml-py` where a GPU is
    pynvml = None

SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap (the same bit as the older ThrottleReason name)


class StepLineClock:
    """The times at which new step lines appear in a growing log file (read from where the last call left
    off; a missing file is simply not there yet)."""

    def __init__(self, path, is_step_line):
        self.path, self.is_step_line = path, is_step_line
        self.times = []
        self._offset, self._partial = 0, ""

    def poll(self, now):
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk.decode(errors="replace")).split("\n")
        self.times += [now for line in lines if self.is_step_line(line)]


def summarize(samples, step_times, warmup, step_ms):
    """Over the samples (time s, energy mJ, SM MHz, power-capped) taken from the end of step `warmup` to the
    end of the last step: {"power_w" (energy counter / time), "sm_mhz" (mean), "power_capped" (share of
    samples), "joules_per_step" (power_w × step_ms)}; None when warmup < 1, no step after it, or fewer
    than two samples in the window."""
    if warmup < 1 or len(step_times) <= warmup:
        return None
    start, end = step_times[warmup - 1], step_times[-1]
    window = [s for s in samples if start <= s[0] <= end]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return None
    power_w = (window[-1][1] - window[0][1]) / 1e3 / (window[-1][0] - window[0][0])
    return {"power_w": power_w, "sm_mhz": sum(s[2] for s in window) / len(window),
            "power_capped": sum(1 for s in window if s[3]) / len(window), "joules_per_step": power_w * step_ms / 1e3}


class PowerPoller:
    """Samples GPU `gpu_index` (NVML's numbering, as nvidia-smi's) while a child writes step lines to
    step_log; stop() ends it, timed_steps() reads it back."""

    def __init__(self, gpu_index, step_log, is_step_line, interval=0.05):
        self.clock = StepLineClock(step_log, is_step_line)
        self.samples = []  # (time s, energy mJ, SM MHz, power-capped)
        self.interval, self.error, self._handle, self._thread = interval, None, None, None
        self._stop = threading.Event()
        if pynvml is None:
            self.error = "power not measured: no pynvml (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(gpu_index))
            self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            self._sample()
        except pynvml.NVMLError as e:
            self.error, self._handle = f"power not measured: NVML: {e}", None
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:  # nvmlInit itself failed
                pass
            return
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self):
        h = self._handle
        self.samples.append((time.time(), pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
                             pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                             bool(self._reasons(h) & SW_POWER_CAP)))

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self._sample()
            except pynvml.NVMLError as e:
                self.error = f"power sampling stopped: NVML: {e}"
                return
            self.clock.poll(time.time())

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.clock.poll(time.time())
            pynvml.nvmlShutdown()
            self._thread = None

    def timed_steps(self, warmup, step_ms):
        """summarize() over this run's samples and step lines (None when nothing was measured)."""
        return summarize(self.samples, self.clock.times, warmup, step_ms) if self._handle is not None else None
