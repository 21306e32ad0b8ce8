import pytest

from labctl.units import format_rate, parse_duration_ns, parse_rate, parse_size


@pytest.mark.parametrize("text,bps", [("400G", 400e9), ("100Gbit", 100e9), ("25Mbps", 25e6), ("1.5G", 1.5e9),
                                      ("800", 800), (400_000_000, 4e8), ("3.6T", 3.6e12), ("10 Gb/s", 10e9)])
def test_rates(text, bps):
    assert parse_rate(text) == int(bps)


@pytest.mark.parametrize("text,ns", [("5us", 5000), ("2ms", 2_000_000), ("0.5s", 500_000_000), ("7ns", 7),
                                     (1, 1_000_000_000), ("3", 3_000_000_000)])
def test_durations(text, ns):
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize("text,size", [("512KiB", 524288), ("1MB", 1_000_000), ("4M", 4 * 1024**2), (9000, 9000)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["fast", "4x", "G", True])
def test_bad_rate_says_how_to_write_it(bad):
    with pytest.raises(ValueError, match="write it like|unknown rate unit"):
        parse_rate(bad)


def test_format_rate():
    assert format_rate(400e6) == "400 Mbit/s"
    assert format_rate(3.6e9) == "3.6 Gbit/s"


def test_a_rate_as_labctl_prints_it_reads_back():
    from labctl.units import format_rate, parse_rate
    for bps in (100e6, 5e6, 400e9, 25e3):
        assert parse_rate(format_rate(bps)) == bps
    assert parse_rate("100 Mbit/s") == parse_rate("100Mb/s") == parse_rate("100Mbps") == 100_000_000


@pytest.mark.parametrize("text", ["16Mb", "4mb", "2kb", "1Gb"])
def test_a_size_in_bits_is_refused_with_the_bytes_it_may_mean(text):
    """`sizes: [16Mb]` was read as 16 MB: a lower-case b is a bit."""
    from labctl.units import parse_size
    with pytest.raises(ValueError, match="in bits") as err:
        parse_size(text)
    bytes_form = text[:-1].upper() + "B"
    assert f"write {bytes_form}" in str(err.value) and parse_size(bytes_form) > 0
