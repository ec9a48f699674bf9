"""JUnit XML for CI (SPEC §10): one <testsuite> per stage run, one <testcase> per check.

Every name, message and property is XML 1.0 text: a character XML cannot hold (a server's ESC
or NUL in an error message, a lone surrogate) is written as its visible escape
(``redact.printable``: ``\\x1b``), so the file stays one a CI can parse.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.io.atomic import write_atomic
from calibrate.redact import printable


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
            name=printable(self.name),
            tests=str(len(self.cases)),
            failures=str(failures),
            errors="0",
            skipped=str(skipped),
            time=f"{total_s:.3f}",
        )
        if self.properties:
            props = ET.SubElement(suite, "properties")
            for key, value in self.properties.items():
                ET.SubElement(props, "property", name=printable(key), value=printable(value))
        for case in self.cases:
            element = ET.SubElement(
                suite,
                "testcase",
                name=printable(case.name),
                classname=printable(case.classname),
                time=f"{case.time_s:.3f}",
            )
            if case.failure is not None:
                message = printable(case.failure)
                kind = printable(case.failure_type or "failed")
                failure = ET.SubElement(element, "failure", message=message, type=kind)
                failure.text = message
            elif case.skipped is not None:
                ET.SubElement(element, "skipped", message=printable(case.skipped))
        ET.indent(suites)
        return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"

    def write(self, path: Path) -> None:
        write_atomic(path, self.to_xml())
