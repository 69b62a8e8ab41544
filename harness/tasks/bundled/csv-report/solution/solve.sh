#!/bin/bash
{ echo "name,score"; sort -k2,2nr /app/scores.txt | awk '{print $1","$2}'; } > /app/report.csv
