"""JUnit XML for CI (SPEC §10): one <testsuite> per stage run, one <testcase> per check.

Every name, message and property is XML 1.0 text: a character XML cannot hold (a server's ESC
or NUL in an error message, a lone surrogate) is written as its visible escape (``\\x1b``), so
the file stays one a CI can parse.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.io.atomic import write_atomic

# What XML 1.0 has no room for: C0 controls but tab, newline and CR; lone surrogates; U+FFFE/F.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` as XML 1.0 can hold it: each character it cannot as a visible escape."""
    return _NOT_XML.sub(lambda found: repr(found.group())[1:-1], text)


@dataclass(frozen=True)
class JUnitCase:
    name: str
    classname: str
    time_s: float = 0.0
    failure: str | None = None  # the verdict reason; None when the check passed
    failure_type: str | None = None  # e.g. the error kinds, "oom,timeout"
    skipped: str | None = None


@dataclass
class JUnitSuite:
    """Collects the checks of one stage run; ``write`` renders and saves the XML."""

    name: str
    properties: dict[str, str] = field(default_factory=dict)
    cases: list[JUnitCase] = field(default_factory=list)

    def add(self, case: JUnitCase) -> None:
        self.cases.append(case)

    def check(
        self, name: str, passed: bool, reason: str = "", *, kind: str = "", time_s: float = 0.0
    ) -> None:
        self.add(
            JUnitCase(
                name=name,
                classname=f"calibrate.{self.name}",
                time_s=time_s,
                failure=None if passed else (reason or "failed"),
                failure_type=None if passed else (kind or "failed"),
            )
        )

    def to_xml(self) -> str:
        failures = sum(1 for c in self.cases if c.failure is not None)
        skipped = sum(1 for c in self.cases if c.skipped is not None)
        total_s = sum(c.time_s for c in self.cases)
        suites = ET.Element("testsuites", name="calibrate")
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=xml_text(self.name),
            tests=str(len(self.cases)),
            failures=str(failures),
            errors="0",
            skipped=str(skipped),
            time=f"{total_s:.3f}",
        )
        if self.properties:
            props = ET.SubElement(suite, "properties")
            for key, value in self.properties.items():
                ET.SubElement(props, "property", name=xml_text(key), value=xml_text(value))
        for case in self.cases:
            element = ET.SubElement(
                suite,
                "testcase",
                name=xml_text(case.name),
                classname=xml_text(case.classname),
                time=f"{case.time_s:.3f}",
            )
            if case.failure is not None:
                message = xml_text(case.failure)
                kind = xml_text(case.failure_type or "failed")
                failure = ET.SubElement(element, "failure", message=message, type=kind)
                failure.text = message
            elif case.skipped is not None:
                ET.SubElement(element, "skipped", message=xml_text(case.skipped))
        ET.indent(suites)
        return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"

    def write(self, path: Path) -> None:
        write_atomic(path, self.to_xml())
