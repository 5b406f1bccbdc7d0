"""The parts of python -m hora.bench multihost that need no namespaces:
rates, the command line, and the summary of a sweep."""

import pytest

from hora.bench import multihost, netns_hosts


@pytest.mark.parametrize("text,bits", [("1gbit", 1e9), ("500mbit", 5e8), ("2.5gbit", 2.5e9),
                                       ("800kbit", 8e5), (" 10GBIT ", 1e10)])
def test_rates_in_tc_units(text, bits):
    assert netns_hosts.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["1gb", "gbit", "-1gbit", "0mbit", "fast"])
def test_bad_rates_say_what_is_expected(text):
    with pytest.raises(ValueError, match="expected a number followed by kbit, mbit or gbit"):
        netns_hosts.parse_rate(text)


def test_command_line_checks(capsys):
    args = multihost.parse(["--rate", "2gbit", "--hosts", "3"])
    assert args.rate_bits == 2e9 and args.hosts == 3 and args.timing == "loop"
    for bad, message in [(["--hosts", "1"], "--hosts: between 2 and 8"),
                         (["--rate", "fast"], "--rate: rate 'fast'"),
                         (["--min-bytes", "8", "--max-bytes", "4"], "--min-bytes must be")]:
        with pytest.raises(SystemExit):
            multihost.parse(bad)
        assert message in capsys.readouterr().err


def test_summary_gives_shares_of_the_link_and_ratios():
    rows = [{"size": 1024, "impl": "hora", "busbw": 0.1, "time_us": 10.0, "wrong": 0},
            {"size": 1024, "impl": "mpi", "busbw": 0.05, "time_us": 20.0, "wrong": 0},
            {"size": 512, "impl": "hora", "busbw": 0.08, "time_us": 6.0, "wrong": 0}]
    summary = multihost.summarize(rows, link_bytes=0.125e9, goodput=0.1e9)
    assert [entry["size"] for entry in summary] == [512, 1024]
    big = summary[1]
    assert big["impls"]["hora"]["of_link"] == pytest.approx(0.8)
    assert big["impls"]["hora"]["of_tcp"] == pytest.approx(1.0)
    assert big["hora_over"] == {"mpi": pytest.approx(2.0)}
    assert summary[0]["hora_over"] == {}
