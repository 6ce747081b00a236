import pytest

from pipeplan.errors import PipeplanError
from pipeplan.units import parse_bandwidth, parse_bytes, parse_time


@pytest.mark.parametrize("text,value", [("128Gbps", 16e9), ("50Gb/s", 6.25e9), ("10GB/s", 10e9),
                                        ("900MB/s", 9e8), ("1e9B/s", 1e9), (2.5e9, 2.5e9), ("1Mbps", 125e3)])
def test_bandwidth(text, value):
    assert parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("32GiB", 32 * 2**30), ("16GB", 16e9), ("1024B", 1024),
                                        ("512MiB", 512 * 2**20), (7, 7)])
def test_bytes(text, value):
    assert parse_bytes(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("5ms", 5e-3), ("2us", 2e-6), ("3ns", 3e-9), ("1.5s", 1.5), ("0", 0.0)])
def test_time(text, value):
    assert parse_time(text) == pytest.approx(value)


@pytest.mark.parametrize("fn,text", [(parse_bandwidth, "fast"), (parse_bandwidth, "-1Gbps"),
                                     (parse_bytes, "12 parsecs"), (parse_time, "-5"), (parse_bytes, True),
                                     (parse_time, "nan")])
def test_bad_values(fn, text):
    with pytest.raises(PipeplanError):
        fn(text)


@pytest.mark.parametrize("fn,text", [(parse_bandwidth, "128"), (parse_bytes, "1024"), (parse_time, "5"),
                                     (parse_bandwidth, "1e9")])
def test_text_without_a_unit_is_refused_but_zero_and_file_numbers_are_not(fn, text):
    with pytest.raises(PipeplanError, match="has no unit"):
        fn(text)
    assert fn("0") == 0.0 and fn(1e9) == 1e9  # a number in a file is in the base unit
